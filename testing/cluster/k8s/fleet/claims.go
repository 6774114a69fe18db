package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
)

// podClaim is the name a fleet pod gives its ResourceClaim (spec.resourceClaims[].name).
const podClaim = "dra"

func claimName(i int) string { return fmt.Sprintf("c%06d", i) }

// loadClaimTemplate: the claim spec of the first ResourceClaimTemplate in path (YAML or JSON,
// several documents; the others, such as an example's pod, are skipped).
func loadClaimTemplate(path string) (*resourcev1.ResourceClaimSpec, error) {
	if path == "" {
		return nil, errors.New("a file is required")
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	for doc := 1; ; doc++ {
		var t resourcev1.ResourceClaimTemplate
		if err := dec.Decode(&t); errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: no ResourceClaimTemplate", path)
		} else if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, doc, err)
		}
		if t.Kind == "ResourceClaimTemplate" {
			if len(t.Spec.Spec.Devices.Requests) == 0 {
				return nil, fmt.Errorf("%s: document %d (%s): no spec.spec.devices.requests", path, doc, t.Name)
			}
			return &t.Spec.Spec, nil
		}
	}
}

// useClaim makes p's container use the ResourceClaim named claim instead of extended resources.
func useClaim(p *corev1.Pod, claim string) {
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: podClaim, ResourceClaimName: &claim}}
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: podClaim}}}
}

// claimsAllocated counts the pods of ns whose claim is allocated with every result from the pool
// named after the pod's node (node-local devices of a driver that names its pool after the node,
// as gpulet's does).
func claimsAllocated(ctx context.Context, cs *kubernetes.Clientset, ns string) (int, error) {
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	claims, err := cs.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	byName := map[string]*resourcev1.ResourceClaim{}
	for i := range claims.Items {
		byName[claims.Items[i].Name] = &claims.Items[i]
	}
	n := 0
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" || len(p.Spec.ResourceClaims) != 1 || p.Spec.ResourceClaims[0].ResourceClaimName == nil {
			continue
		}
		c := byName[*p.Spec.ResourceClaims[0].ResourceClaimName]
		if c == nil || c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) == 0 {
			continue
		}
		ok := true
		for _, r := range c.Status.Allocation.Devices.Results {
			ok = ok && r.Pool == p.Spec.NodeName
		}
		if ok {
			n++
		}
	}
	return n, nil
}
