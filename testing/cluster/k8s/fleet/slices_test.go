package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// templateSlice: a slice of node "tmpl-0" as gpulet's publisher writes one (name, pool, node,
// owner reference), with one device.
func templateSlice(suffix string) resourcev1.ResourceSlice {
	node := "tmpl-0"
	return resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu.gpulet.io-" + suffix, ResourceVersion: "17", UID: "slice-uid",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: "tmpl-uid"}}},
		Spec: resourcev1.ResourceSliceSpec{Driver: "gpu.gpulet.io", NodeName: &node,
			Pool:    resourcev1.ResourcePool{Name: node, Generation: 3, ResourceSliceCount: 2},
			Devices: []resourcev1.Device{{Name: "gpu-0"}}},
	}
}

func writeTemplate(t *testing.T, slices ...resourcev1.ResourceSlice) string {
	t.Helper()
	b, err := json.Marshal(resourcev1.ResourceSliceList{Items: slices})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "slices.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCloneNamesTheNodeAndKeepsTheContent(t *testing.T) {
	tmpl, err := loadSliceTemplate(writeTemplate(t, templateSlice("c00"), templateSlice("d00")))
	if err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "f1000-00042", UID: types.UID("node-uid")}}
	s, err := tmpl.clone(1, node)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "f1000-00042-gpu.gpulet.io-d00" || *s.Spec.NodeName != node.Name || s.Spec.Pool.Name != node.Name {
		t.Errorf("name %q, node %q, pool %q: want the node's", s.Name, *s.Spec.NodeName, s.Spec.Pool.Name)
	}
	if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Name != node.Name || s.OwnerReferences[0].UID != node.UID {
		t.Errorf("owner references %+v: want the node's", s.OwnerReferences)
	}
	if s.ResourceVersion != "" || s.UID != "" {
		t.Errorf("resourceVersion %q, uid %q carried over from the template", s.ResourceVersion, s.UID)
	}
	if s.Spec.Pool.Generation != 3 || s.Spec.Pool.ResourceSliceCount != 2 || s.Spec.Driver != "gpu.gpulet.io" ||
		len(s.Spec.Devices) != 1 || s.Spec.Devices[0].Name != "gpu-0" {
		t.Errorf("spec %+v: want the template's content", s.Spec)
	}
	if *tmpl.slices[1].Spec.NodeName != "tmpl-0" || tmpl.slices[1].OwnerReferences[0].Name != "tmpl-0" {
		t.Error("cloning changed the template")
	}
}

func TestCloneRefusesTheTemplateNodeLeftElsewhere(t *testing.T) {
	s := templateSlice("d00")
	s.Spec.Devices[0].Attributes = map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
		"host": {StringValue: new("tmpl-0")}}
	tmpl, err := loadSliceTemplate(writeTemplate(t, s))
	if err != nil {
		t.Fatal(err)
	}
	_, err = tmpl.clone(0, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "f-00000"}})
	if err == nil || !strings.Contains(err.Error(), `"tmpl-0" is left`) {
		t.Errorf("err = %v, want the leftover node name named", err)
	}
}

func TestLoadSliceTemplateRefusesSlicesOfSeveralNodes(t *testing.T) {
	other := templateSlice("d01")
	name := "tmpl-1"
	other.Spec.NodeName = &name
	if _, err := loadSliceTemplate(writeTemplate(t, templateSlice("d00"), other)); err == nil {
		t.Error("slices of two nodes accepted as one node's")
	}
	if _, err := loadSliceTemplate(writeTemplate(t)); err == nil {
		t.Error("an empty list accepted")
	}
}

func TestLoadClaimTemplateReadsTheExample(t *testing.T) {
	spec, err := loadClaimTemplate("../../../../deploy/examples/dra/one-gpu.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := spec.Devices.Requests
	if len(r) != 1 || r[0].Exactly == nil || r[0].Exactly.DeviceClassName != "gpu.gpulet.io" {
		t.Errorf("requests %+v: want one exactly-request of DeviceClass gpu.gpulet.io", r)
	}
	p := filepath.Join(t.TempDir(), "pod.yaml")
	if err := os.WriteFile(p, []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadClaimTemplate(p); err == nil || !strings.Contains(err.Error(), "no ResourceClaimTemplate") {
		t.Errorf("err = %v, want no ResourceClaimTemplate", err)
	}
}
