package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// sliceTemplate is one node's ResourceSlices as a DRA driver published them: every slice names
// the same node (spec.nodeName), pool and owning Node.
type sliceTemplate struct {
	node   string
	slices []resourcev1.ResourceSlice
}

func loadSliceTemplate(path string) (*sliceTemplate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var l resourcev1.ResourceSliceList
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(l.Items) == 0 {
		return nil, fmt.Errorf("%s: no ResourceSlices (items)", path)
	}
	t := &sliceTemplate{slices: l.Items}
	for i := range l.Items {
		s := &l.Items[i]
		if s.Spec.NodeName == nil || *s.Spec.NodeName == "" {
			return nil, fmt.Errorf("%s: items[%d] (%s): no spec.nodeName: not a node-local slice", path, i, s.Name)
		}
		if t.node == "" {
			t.node = *s.Spec.NodeName
		}
		if *s.Spec.NodeName != t.node || s.Spec.Pool.Name != t.node || !strings.Contains(s.Name, t.node) {
			return nil, fmt.Errorf("%s: items[%d] (%s): every slice must be of node %s, in the pool of that name, "+
				"and carry the name in its own (got node %q, pool %q)", path, i, s.Name, t.node, *s.Spec.NodeName, s.Spec.Pool.Name)
		}
	}
	return t, nil
}

// clone: template slice i as `node` would publish it. Only what names the node changes (the
// object's name, spec.nodeName, the pool's name, the owner reference to the Node); the devices,
// counters and attributes are the template's. An error when the node's name is left anywhere
// else in the object (what the clone would then carry is not this node's).
func (t *sliceTemplate) clone(i int, node *corev1.Node) (*resourcev1.ResourceSlice, error) {
	src := &t.slices[i]
	s := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: strings.Replace(src.Name, t.node, node.Name, 1),
			Labels: src.Labels, Annotations: src.Annotations},
		Spec: *src.Spec.DeepCopy(),
	}
	for _, o := range src.OwnerReferences {
		if o.Kind == "Node" && o.Name == t.node {
			o.Name, o.UID = node.Name, node.UID
		}
		s.OwnerReferences = append(s.OwnerReferences, o)
	}
	s.Spec.NodeName = &node.Name
	s.Spec.Pool.Name = node.Name
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	if bytes.Contains(b, []byte(t.node)) {
		return nil, fmt.Errorf("slice %s: the template's node name %q is left in the clone for %s", src.Name, t.node, node.Name)
	}
	return s, nil
}

type slicesResult struct {
	Nodes          int     `json:"nodes"`
	Slices         int     `json:"slices"`
	DevicesPerNode int     `json:"devices_per_node"`
	BytesPerNode   int     `json:"bytes_per_node"` // the node's slices as JSON
	Seconds        float64 `json:"seconds"`
}

// runSlices publishes the template's slices for every node of a fleet (the nodes labelled
// gpulet.io/fleet=<fleet>), replacing what is there; or deletes them (-delete).
func runSlices(args []string) error {
	fs := flag.NewFlagSet("fleet slices", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (default $KUBECONFIG)")
	templatePath := fs.String("template", "", "one node's ResourceSlices, as `kubectl get resourceslices -o json` prints them (required)")
	fleet := fs.String("fleet", "", "the gpulet.io/fleet label of the nodes (fleet nodes: the prefix without its trailing dash; required)")
	workers := fs.Int("workers", 16, "concurrent API calls")
	del := fs.Bool("delete", false, "delete the clones instead (the garbage collector would, with the nodes, at "+
		"kube-controller-manager's 20 requests/s)")
	_ = fs.Parse(args)
	if *templatePath == "" || *fleet == "" {
		return errors.New("slices: -template FILE and -fleet LABEL are required")
	}
	t, err := loadSliceTemplate(*templatePath)
	if err != nil {
		return err
	}
	cs, err := client(*kubeconfig, 2000, 4000)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "gpulet.io/fleet=" + *fleet, ResourceVersion: "0"})
	if err != nil {
		return err
	}
	if len(nodes.Items) == 0 {
		return fmt.Errorf("slices: no node labelled gpulet.io/fleet=%s", *fleet)
	}
	r := slicesResult{Nodes: len(nodes.Items), Slices: len(nodes.Items) * len(t.slices)}
	for i := range t.slices {
		r.DevicesPerNode += len(t.slices[i].Spec.Devices)
		b, _ := json.Marshal(&t.slices[i])
		r.BytesPerNode += len(b)
	}
	t0 := time.Now()
	var done atomic.Int64
	err = parallel(ctx, r.Slices, *workers, func(ctx context.Context, k int) error {
		node := &nodes.Items[k/len(t.slices)]
		s, err := t.clone(k%len(t.slices), node)
		if err != nil {
			return err
		}
		api := cs.ResourceV1().ResourceSlices()
		if *del {
			if err := api.Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("slice %s: %w", s.Name, err)
			}
			return nil
		}
		_, err = api.Create(ctx, s, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			var old *resourcev1.ResourceSlice
			if old, err = api.Get(ctx, s.Name, metav1.GetOptions{}); err == nil {
				s.ResourceVersion = old.ResourceVersion
				_, err = api.Update(ctx, s, metav1.UpdateOptions{})
			}
		}
		if err != nil {
			return fmt.Errorf("slice %s: %w", s.Name, err)
		}
		if n := done.Add(1); n%5000 == 0 {
			logf("%d of %d slices published", n, r.Slices)
		}
		return nil
	})
	if err != nil {
		return err
	}
	r.Seconds = time.Since(t0).Seconds()
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
	return nil
}
