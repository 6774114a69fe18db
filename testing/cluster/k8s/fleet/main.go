// Command fleet puts a fleet of GPU nodes into a real API server without a kubelet for any of them,
// and measures how fast the real kube-scheduler places pods on it (docs/real-cluster.md, "A fleet
// without kubelets"). Nothing here is shipped; it is a test and benchmark client.
//
//	fleet nodes -count N [flags]   create N Node objects of 8 GPUs each (nvidia.com/gpu and the
//	                               memory pool gpulet.io/gpu-memory-1gi, as gpulet's agent
//	                               advertises them), their kube-node-lease Leases and the
//	                               gpulet-memory-<node> ConfigMaps the extender reads; keep them
//	                               Ready (Leases renewed, status refreshed, ConfigMaps republished
//	                               within their heartbeat) until SIGTERM/SIGINT
//	fleet pods -count M [flags]    create M pods in a fresh namespace and measure, from a watch,
//	                               creation -> bound (spec.nodeName set) per pod; print one JSON
//	                               line: pods/s, p50/p99 latency, how many stayed Pending
//	fleet nodes -setup FILE        the nodes of `gpulet extender replay --compare-placements
//	                               --export FILE` instead (their names, GPU models and counts, and
//	                               memory objects as exported; the objects are not republished)
//	fleet replay -setup FILE       that file's arrivals, one at a time, to the real scheduler: each
//	                               pod created, then bound or found unschedulable (and deleted)
//	                               before the next; prints one JSON line: the allocation ratio and
//	                               the pods placed beside the replay's, and where they differ
//	fleet slices -template FILE    one node's ResourceSlices as a real `gpulet dra` published them
//	                               (kubectl get resourceslices -o json), cloned for every node of a
//	                               fleet: name, spec.nodeName, pool name and owner reference are the
//	                               node's, the rest is gpulet's content byte for byte
//	fleet pods -kind claim ...     pods that each use their own ResourceClaim (the spec of a
//	                               ResourceClaimTemplate, e.g. deploy/examples/dra/one-gpu.yaml),
//	                               claim and pod created one after the other; latency from the
//	                               claim's create to the pod bound, and the claims found allocated
//	                               from the pod's node
//
// All take -kubeconfig (default $KUBECONFIG) and print what they do to stderr.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func usage() {
	fmt.Fprintln(os.Stderr, "usage: fleet nodes|pods|replay|slices [flags]   (fleet nodes -h, fleet pods -h, ...)")
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "nodes":
		err = runNodes(os.Args[2:])
	case "pods":
		err = runPods(os.Args[2:])
	case "replay":
		err = runReplay(os.Args[2:])
	case "slices":
		err = runSlices(os.Args[2:])
	case "-h", "--help", "help":
		usage()
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

func client(kubeconfig string, qps float32, burst int) (*kubernetes.Clientset, error) {
	if kubeconfig == "" {
		kubeconfig = os.Getenv("KUBECONFIG")
	}
	if kubeconfig == "" {
		return nil, errors.New("-kubeconfig or KUBECONFIG is required")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = qps, burst
	cfg.UserAgent = "gpulet-fleet"
	return kubernetes.NewForConfig(cfg)
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "fleet: "+format+"\n", a...)
}

// parallel runs fn(i) for i in [0, n) on `workers` goroutines; the first error stops the rest.
func parallel(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// ---------------------------------------------------------------------------------------------
// nodes

type nodeFlags struct {
	kubeconfig     string
	count          int
	prefix         string
	gpus           int
	memoryGpus     int
	unitsPerGpu    int
	namespace      string
	heartbeat      time.Duration
	leaseRenew     time.Duration
	workers        int
	readyFile      string
	deleteOnExit   bool
	statusInterval time.Duration
	setupPath      string
	setup          *replaySetup // -setup: the nodes come from it
}

func nodeName(f *nodeFlags, i int) string {
	if f.setup != nil {
		return f.setup.Nodes[i].Name
	}
	return fmt.Sprintf("%s%05d", f.prefix, i)
}

// withMemory: the nodes have a memory pool and gpulet-memory-<node> ConfigMaps.
func (f *nodeFlags) withMemory() bool { return f.setup != nil || f.memoryGpus > 0 }

// replaySetup is what `gpulet extender replay --compare-placements --export FILE` writes
// (src/extender/equivalence.h, EquivalenceExport).
type replaySetup struct {
	Resource    string `json:"resource"`
	UnitsPerGpu int64  `json:"unitsPerGpu"`
	Nodes       []struct {
		Name  string `json:"name"`
		Model string `json:"model"`
		Gpus  int64  `json:"gpus"`
	} `json:"nodes"`
	Objects  []corev1.ConfigMap `json:"objects"`
	Arrivals []struct {
		Name   string   `json:"name"`
		Units  int64    `json:"units"`
		Models []string `json:"models"`
		Replay struct {
			Node string `json:"node"`
			Gpu  int    `json:"gpu"`
		} `json:"replay"`
	} `json:"arrivals"`
	Replay struct {
		Placed        int   `json:"placed"`
		Failed        int   `json:"failed"`
		PlacedUnits   int64 `json:"placedUnits"`
		CapacityUnits int64 `json:"capacityUnits"`
	} `json:"replay"`
}

func loadSetup(path string) (*replaySetup, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s := &replaySetup{}
	if err := json.Unmarshal(b, s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(s.Nodes) == 0 || len(s.Objects) != len(s.Nodes) || s.Resource == "" || s.UnitsPerGpu < 1 {
		return nil, fmt.Errorf("%s: not an export of gpulet extender replay --compare-placements (nodes, objects, resource, unitsPerGpu)", path)
	}
	return s, nil
}

// modelLabel carries a setup node's GPU model (the trace's name); an arrival's model list is node
// affinity on it, as the replay restricts the pod to those models.
const modelLabel = "gpulet.io/replay-gpu-model"

// fleetLabel is the value of the nodes' gpulet.io/fleet label: the prefix without its trailing
// dashes (a label value ends with an alphanumeric), so each fleet of one API server is selectable.
func fleetLabel(f *nodeFlags) string { return strings.TrimRight(f.prefix, "-.") }

// memoryJSON is data["memory.json"] as gpulet's node agent publishes it (deviceplugin/
// memory_publisher.cc; the contract in docs/memory-requests.md): every GPU of the pool free.
func memoryJSON(f *nodeFlags, node string, generation int64) string {
	type gpu struct {
		UUID       string `json:"uuid"`
		Index      int    `json:"index"`
		Model      string `json:"model"`
		NumaNode   int    `json:"numaNode"`
		Healthy    bool   `json:"healthy"`
		TotalUnits int    `json:"totalUnits"`
		FreeUnits  int    `json:"freeUnits"`
	}
	gpus := make([]gpu, 0, f.memoryGpus)
	for g := 0; g < f.memoryGpus; g++ {
		gpus = append(gpus, gpu{UUID: fmt.Sprintf("GPU-%s-%d", node, g), Index: g,
			Model: "NVIDIA H100 80GB HBM3", NumaNode: g * 2 / max(f.memoryGpus, 1), Healthy: true,
			TotalUnits: f.unitsPerGpu, FreeUnits: f.unitsPerGpu})
	}
	doc := map[string]any{
		"version": 1, "node": node, "generation": generation, "resource": "gpulet.io/gpu-memory-1gi",
		"unitBytes": 1 << 30, "heartbeatSeconds": int(f.heartbeat / time.Second), "gpus": gpus,
		"pods": []any{},
	}
	b, _ := json.Marshal(doc)
	return string(b)
}

func configMap(f *nodeFlags, i int, generation int64) *corev1.ConfigMap {
	node := nodeName(f, i)
	if f.setup != nil {
		cm := f.setup.Objects[i].DeepCopy()
		cm.Namespace, cm.ResourceVersion = f.namespace, ""
		return cm
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "gpulet-memory-" + node, Namespace: f.namespace,
			Labels: map[string]string{"app.kubernetes.io/name": "gpulet",
				"gpulet.io/memory-pool": "true", "gpulet.io/node": node}},
		Data: map[string]string{"memory.json": memoryJSON(f, node, generation)},
	}
}

func readyConditions(now metav1.Time) []corev1.NodeCondition {
	c := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, LastHeartbeatTime: now,
			LastTransitionTime: now, Message: "gpulet fleet node (no kubelet)"}
	}
	return []corev1.NodeCondition{
		c(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory"),
		c(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure"),
		c(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID"),
		c(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady"),
	}
}

func nodeObject(f *nodeFlags, i int) *corev1.Node {
	name := nodeName(f, i)
	if f.setup != nil {
		// A node of the trace: its GPUs, all in the memory pool; room for as many pods as its
		// GPUs' units could hold (the replay has no pod limit).
		sn := f.setup.Nodes[i]
		units := sn.Gpus * f.setup.UnitsPerGpu
		res := corev1.ResourceList{
			corev1.ResourceCPU:                    resource.MustParse("224"),
			corev1.ResourceMemory:                 resource.MustParse("2Ti"),
			corev1.ResourcePods:                   *resource.NewQuantity(units, resource.DecimalSI),
			"nvidia.com/gpu":                      *resource.NewQuantity(sn.Gpus, resource.DecimalSI),
			corev1.ResourceName(f.setup.Resource): *resource.NewQuantity(units, resource.DecimalSI),
		}
		n := nodeObjectWith(f, name, res)
		n.Labels[modelLabel] = sn.Model
		n.Labels["gpulet.io/gpu-memory.pool"] = "true"
		return n
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("224"),
		corev1.ResourceMemory: resource.MustParse("2Ti"),
		corev1.ResourcePods:   resource.MustParse("110"),
		"nvidia.com/gpu":      *resource.NewQuantity(int64(f.gpus), resource.DecimalSI),
	}
	if f.memoryGpus == 0 {
		return nodeObjectWith(f, name, res)
	}
	res["gpulet.io/gpu-memory-1gi"] = *resource.NewQuantity(int64(f.memoryGpus*f.unitsPerGpu), resource.DecimalSI)
	n := nodeObjectWith(f, name, res)
	n.Labels["gpulet.io/gpu-memory.pool"] = "true"
	n.Labels["gpulet.io/gpu-memory.unit"] = "1Gi"
	return n
}

func nodeObjectWith(f *nodeFlags, name string, res corev1.ResourceList) *corev1.Node {
	labels := map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
		"kubernetes.io/arch": "amd64", "nvidia.com/gpu.present": "true", "gpulet.io/fleet": fleetLabel(f)}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.NodeStatus{Capacity: res, Allocatable: res,
			Conditions: readyConditions(metav1.Now()),
			NodeInfo:   corev1.NodeSystemInfo{KubeletVersion: "v1.37.2", OperatingSystem: "linux", Architecture: "amd64"},
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}}},
	}
}

func runNodes(args []string) error {
	f := &nodeFlags{}
	fs := flag.NewFlagSet("fleet nodes", flag.ExitOnError)
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig (default $KUBECONFIG)")
	fs.IntVar(&f.count, "count", 100, "nodes")
	fs.StringVar(&f.prefix, "prefix", "fleet-", "node name prefix (names are PREFIX00000...)")
	fs.IntVar(&f.gpus, "gpus", 8, "nvidia.com/gpu per node")
	fs.IntVar(&f.memoryGpus, "memory-gpus", 8, "GPUs per node in the memory pool (gpulet.io/gpu-memory-1gi; 0: none, no ConfigMap). "+
		"A real node has each GPU in one pool; the fleet advertises both so one fleet serves whole-GPU and memory runs")
	fs.IntVar(&f.unitsPerGpu, "units-per-gpu", 80, "1 GiB units per GPU (an H100 80GB)")
	fs.StringVar(&f.namespace, "namespace", "gpulet-system", "namespace of the gpulet-memory-<node> ConfigMaps")
	fs.DurationVar(&f.heartbeat, "heartbeat", 5*time.Minute, "heartbeatSeconds the ConfigMaps state; each is republished (generation+1) this often "+
		"(the agent's default is 30s; the extender calls an object stale after 3 heartbeats)")
	fs.DurationVar(&f.leaseRenew, "lease-renew", 10*time.Second, "how often each node's Lease is renewed (the kubelet: 10s of a 40s lease); "+
		"0: never, so the node lifecycle controller marks the nodes unreachable after its grace period (a control)")
	fs.DurationVar(&f.statusInterval, "status-interval", 5*time.Minute, "how often each node's status conditions are refreshed (the kubelet's nodeStatusReportFrequency)")
	fs.IntVar(&f.workers, "workers", 16, "concurrent API calls")
	fs.StringVar(&f.readyFile, "ready-file", "", "written once every node is Ready and untainted")
	fs.BoolVar(&f.deleteOnExit, "delete-on-exit", true, "delete the nodes, Leases and ConfigMaps on SIGTERM/SIGINT")
	fs.StringVar(&f.setupPath, "setup", "", "the nodes of this export (gpulet extender replay --compare-placements --export) instead of -count, -gpus, -memory-gpus; "+
		"their objects are published once (give the extender a --stale-after longer than the run)")
	_ = fs.Parse(args)
	if f.setupPath != "" {
		s, err := loadSetup(f.setupPath)
		if err != nil {
			return err
		}
		f.setup, f.count = s, len(s.Nodes)
	}
	if f.count < 1 || f.gpus < 0 || f.memoryGpus < 0 || f.memoryGpus > f.gpus || f.unitsPerGpu < 1 || f.heartbeat < time.Second {
		return errors.New("nodes: -count >= 1, 0 <= -memory-gpus <= -gpus, -units-per-gpu >= 1, -heartbeat >= 1s")
	}
	cs, err := client(f.kubeconfig, 2000, 4000)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	bg := context.Background()

	if f.withMemory() {
		_, err := cs.CoreV1().Namespaces().Create(bg, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.namespace}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("namespace %s: %w", f.namespace, err)
		}
	}
	t0 := time.Now()
	leases := make([]*coordinationv1.Lease, f.count)
	var leaseMu sync.Mutex
	err = parallel(ctx, f.count, f.workers, func(ctx context.Context, i int) error {
		name := nodeName(f, i)
		want := nodeObject(f, i)
		n, err := cs.CoreV1().Nodes().Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			n, err = cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		}
		if err != nil {
			return fmt.Errorf("node %s: %w", name, err)
		}
		// The API server drops status on create: set it through the status subresource (again
		// after a conflict: the node lifecycle controller writes new nodes too).
		for attempt := 0; ; attempt++ {
			n.Status = want.Status
			got, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
			if err == nil {
				n = got
				break
			}
			if !apierrors.IsConflict(err) || attempt == 10 {
				return fmt.Errorf("node %s status: %w", name, err)
			}
			if n, err = cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
				return fmt.Errorf("node %s: %w", name, err)
			}
		}
		dur := int32(40)
		now := metav1.NewMicroTime(time.Now())
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-node-lease",
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: name, UID: n.UID}}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: &dur, RenewTime: &now},
		}
		got, err := cs.CoordinationV1().Leases("kube-node-lease").Create(ctx, l, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			got, err = cs.CoordinationV1().Leases("kube-node-lease").Get(ctx, name, metav1.GetOptions{})
		}
		if err != nil {
			return fmt.Errorf("lease %s: %w", name, err)
		}
		leaseMu.Lock()
		leases[i] = got
		leaseMu.Unlock()
		if f.withMemory() {
			cm := configMap(f, i, 1)
			_, err := cs.CoreV1().ConfigMaps(f.namespace).Create(ctx, cm, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				_, err = cs.CoreV1().ConfigMaps(f.namespace).Update(ctx, cm, metav1.UpdateOptions{})
			}
			if err != nil {
				return fmt.Errorf("configmap %s: %w", cm.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	logf("created %d nodes (%d GPUs, %d in the memory pool, each) with Leases and ConfigMaps in %.1fs",
		f.count, f.gpus, f.memoryGpus, time.Since(t0).Seconds())

	var wg sync.WaitGroup
	// Leases: each renewed every lease-renew, spread evenly over the interval.
	wg.Add(1)
	go func() {
		defer wg.Done()
		if f.leaseRenew <= 0 {
			return
		}
		renewLoop(ctx, f.count, f.leaseRenew, f.workers, func(ctx context.Context, i int) {
			leaseMu.Lock()
			l := leases[i].DeepCopy()
			leaseMu.Unlock()
			now := metav1.NewMicroTime(time.Now())
			l.Spec.RenewTime = &now
			got, err := cs.CoordinationV1().Leases("kube-node-lease").Update(ctx, l, metav1.UpdateOptions{})
			if apierrors.IsConflict(err) {
				if got, err = cs.CoordinationV1().Leases("kube-node-lease").Get(ctx, l.Name, metav1.GetOptions{}); err == nil {
					got.Spec.RenewTime = &now
					got, err = cs.CoordinationV1().Leases("kube-node-lease").Update(ctx, got, metav1.UpdateOptions{})
				}
			}
			if err != nil {
				if ctx.Err() == nil {
					logf("lease %s: %v", l.Name, err)
				}
				return
			}
			leaseMu.Lock()
			leases[i] = got
			leaseMu.Unlock()
		})
	}()
	// Status conditions (their heartbeat) at the kubelet's report frequency.
	wg.Add(1)
	go func() {
		defer wg.Done()
		renewLoop(ctx, f.count, f.statusInterval, f.workers, func(ctx context.Context, i int) {
			name := nodeName(f, i)
			now := metav1.Now()
			patch, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": readyConditions(now)}})
			if _, err := cs.CoreV1().Nodes().PatchStatus(ctx, name, patch); err != nil && ctx.Err() == nil {
				logf("node %s status: %v", name, err)
			}
		})
	}()
	if f.memoryGpus > 0 && f.setup == nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gens := make([]atomic.Int64, f.count)
			renewLoop(ctx, f.count, f.heartbeat, f.workers, func(ctx context.Context, i int) {
				cm := configMap(f, i, gens[i].Add(1)+1)
				if _, err := cs.CoreV1().ConfigMaps(f.namespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
					logf("configmap %s: %v", cm.Name, err)
				}
			})
		}()
	}

	// Ready: every node Ready=True and without the not-ready taint the API server's admission put
	// on it at creation (the node lifecycle controller removes it once it sees Ready).
	if err := waitNodesReady(ctx, cs, f); err != nil {
		return err
	}
	logf("all %d nodes Ready and untainted %.1fs after the first was created", f.count, time.Since(t0).Seconds())
	if f.readyFile != "" {
		if err := os.WriteFile(f.readyFile, []byte(strconv.Itoa(f.count)+"\n"), 0o644); err != nil {
			return err
		}
	}
	<-ctx.Done()
	wg.Wait()
	if f.deleteOnExit {
		logf("deleting the fleet")
		dctx, cancel := context.WithTimeout(bg, 5*time.Minute)
		defer cancel()
		err := parallel(dctx, f.count, f.workers, func(ctx context.Context, i int) error {
			name := nodeName(f, i)
			if err := cs.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			if err := cs.CoordinationV1().Leases("kube-node-lease").Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			if f.withMemory() {
				if err := cs.CoreV1().ConfigMaps(f.namespace).Delete(ctx, "gpulet-memory-"+name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("delete: %w", err)
		}
	}
	return nil
}

// renewLoop calls fn(i) for every i once per interval, spread evenly, on `workers` goroutines,
// until ctx ends.
func renewLoop(ctx context.Context, n int, interval time.Duration, workers int, fn func(ctx context.Context, i int)) {
	work := make(chan int, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				fn(ctx, i)
			}
		}()
	}
	defer func() { close(work); wg.Wait() }()
	step := interval / time.Duration(n)
	tick := time.NewTicker(max(step, time.Millisecond))
	defer tick.Stop()
	per := 1
	if step < time.Millisecond {
		per = int(math.Ceil(float64(time.Millisecond) / float64(max(step, 1))))
	}
	for i := 0; ; {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for k := 0; k < per; k++ {
			select {
			case work <- i:
			case <-ctx.Done():
				return
			}
			i = (i + 1) % n
		}
	}
}

func waitNodesReady(ctx context.Context, cs *kubernetes.Clientset, f *nodeFlags) error {
	for {
		list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "gpulet.io/fleet=" + fleetLabel(f), ResourceVersion: "0"})
		if err != nil {
			return err
		}
		ready := 0
		for i := range list.Items {
			n := &list.Items[i]
			if len(n.Spec.Taints) > 0 {
				continue
			}
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		if ready >= f.count {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("interrupted with %d of %d nodes Ready and untainted", ready, f.count)
		case <-time.After(time.Second):
		}
	}
}

// ---------------------------------------------------------------------------------------------
// pods

type podResult struct {
	Kind          string  `json:"kind"`
	Scheduler     string  `json:"scheduler"`
	Pods          int     `json:"pods"`
	Bound         int     `json:"bound"`
	Pending       int     `json:"pending"`
	Seconds       float64 `json:"seconds"`
	PodsPerSecond float64 `json:"pods_per_second"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
	MaxMs         float64 `json:"max_ms"`
	CreateSeconds float64 `json:"create_seconds"`
	Rewatches     int64   `json:"rewatches"`
	// -kind claim: claims found allocated, every result from the pool of their pod's node (a
	// DRA driver's node-local pool, named after the node as gpulet's are).
	Allocated *int `json:"allocated,omitempty"`
}

func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	k := int(math.Ceil(p*float64(len(sorted)))) - 1
	k = min(max(k, 0), len(sorted)-1)
	return float64(sorted[k].Microseconds()) / 1000
}

func runPods(args []string) error {
	fs := flag.NewFlagSet("fleet pods", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (default $KUBECONFIG)")
	count := fs.Int("count", 100, "pods")
	kind := fs.String("kind", "gpu", "gpu: limits nvidia.com/gpu; memory: limits gpulet.io/gpu-memory-1gi; "+
		"claim: one ResourceClaim per pod, of -claim-template's spec")
	claimTemplate := fs.String("claim-template", "", "-kind claim: a file holding a ResourceClaimTemplate (YAML or JSON, "+
		"other documents ignored; e.g. deploy/examples/dra/one-gpu.yaml); each pod's claim has its spec.spec")
	amount := fs.Int("amount", 1, "GPUs (kind gpu) or 1 GiB units (kind memory) per pod")
	ns := fs.String("namespace", "fleet-pods", "namespace (deleted and made again first)")
	scheduler := fs.String("scheduler", "default-scheduler", "spec.schedulerName")
	workers := fs.Int("workers", 8, "concurrent creates")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up waiting for binds after this")
	keep := fs.Bool("keep", false, "leave the pods (default: delete the namespace at the end)")
	selector := fs.String("node-selector", "", "KEY=VALUE: the pods' spec.nodeSelector (e.g. gpulet.io/fleet=fleet)")
	_ = fs.Parse(args)
	nodeSelector, err := selectorFlag(*selector)
	if err != nil {
		return fmt.Errorf("pods: %w", err)
	}
	var res corev1.ResourceName
	switch *kind {
	case "gpu":
		res = "nvidia.com/gpu"
	case "memory":
		res = "gpulet.io/gpu-memory-1gi"
	case "claim":
	default:
		return fmt.Errorf("pods: -kind gpu|memory|claim, got %q", *kind)
	}
	var claimSpec *resourcev1.ResourceClaimSpec
	if *kind == "claim" {
		if claimSpec, err = loadClaimTemplate(*claimTemplate); err != nil {
			return fmt.Errorf("pods: -claim-template: %w", err)
		}
	}
	cs, ctx, stop, err := podSession(*kubeconfig, *ns)
	if err != nil {
		return err
	}
	defer stop()

	created := make([]time.Time, *count)
	bound := make([]time.Time, *count)
	var mu sync.Mutex
	nBound := 0
	allBound := make(chan struct{})
	index := func(name string) int {
		var i int
		if _, err := fmt.Sscanf(name, "p%06d", &i); err != nil || i < 0 || i >= *count {
			return -1
		}
		return i
	}
	record := func(p *corev1.Pod, now time.Time) {
		i := index(p.Name)
		if i < 0 || p.Spec.NodeName == "" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if bound[i].IsZero() {
			bound[i] = now
			nBound++
			if nBound == *count {
				close(allBound)
			}
		}
	}
	// The watch from before the first create; when the API server ends it (a slow watcher is
	// closed under load), a list catches up (pods bound meanwhile count as bound at the list, an
	// overestimate) and the watch resumes from the list's version.
	w, err := cs.CoreV1().Pods(*ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.Everything().String()})
	if err != nil {
		return err
	}
	var rewatches atomic.Int64
	go func() {
		for {
			for ev := range w.ResultChan() {
				if p, ok := ev.Object.(*corev1.Pod); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
					record(p, time.Now())
				}
			}
			if ctx.Err() != nil {
				return
			}
			rewatches.Add(1)
			for {
				list, err := cs.CoreV1().Pods(*ns).List(ctx, metav1.ListOptions{})
				if err == nil {
					now := time.Now()
					for i := range list.Items {
						record(&list.Items[i], now)
					}
					w, err = cs.CoreV1().Pods(*ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
				}
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
	}()

	t0 := time.Now()
	err = parallel(ctx, *count, *workers, func(ctx context.Context, i int) error {
		p := fleetPod(fmt.Sprintf("p%06d", i), *ns, *scheduler, nodeSelector, res, int64(*amount))
		mu.Lock()
		created[i] = time.Now()
		mu.Unlock()
		if claimSpec != nil {
			c := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: claimName(i), Namespace: *ns}, Spec: *claimSpec.DeepCopy()}
			if _, err := cs.ResourceV1().ResourceClaims(*ns).Create(ctx, c, metav1.CreateOptions{}); err != nil {
				return err
			}
			useClaim(p, c.Name)
		}
		_, err := cs.CoreV1().Pods(*ns).Create(ctx, p, metav1.CreateOptions{})
		return err
	})
	createSeconds := time.Since(t0).Seconds()
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	select {
	case <-allBound:
	case <-time.After(*timeout):
	case <-ctx.Done():
	}
	mu.Lock()
	var lat []time.Duration
	var last time.Time
	for i := range bound {
		if !bound[i].IsZero() {
			lat = append(lat, bound[i].Sub(created[i]))
			if bound[i].After(last) {
				last = bound[i]
			}
		}
	}
	mu.Unlock()
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	r := podResult{Kind: *kind, Scheduler: *scheduler, Pods: *count, Bound: len(lat), Pending: *count - len(lat),
		CreateSeconds: createSeconds, Rewatches: rewatches.Load(), P50Ms: percentile(lat, 0.50), P99Ms: percentile(lat, 0.99)}
	if len(lat) > 0 {
		r.Seconds = last.Sub(t0).Seconds()
		r.PodsPerSecond = float64(len(lat)) / r.Seconds
		r.MaxMs = float64(lat[len(lat)-1].Microseconds()) / 1000
	}
	if claimSpec != nil {
		n, err := claimsAllocated(ctx, cs, *ns)
		if err != nil {
			return err
		}
		r.Allocated = &n
	}
	return finish(r, cs, *ns, *keep)
}

// ---------------------------------------------------------------------------------------------
// replay

type replayResult struct {
	Pods             int      `json:"pods"`
	Placed           int      `json:"placed"`
	Failed           int      `json:"failed"`
	PlacedUnits      int64    `json:"placed_units"`
	CapacityUnits    int64    `json:"capacity_units"`
	Allocation       float64  `json:"allocation"` // placed units / capacity
	ReplayPlaced     int      `json:"replay_placed"`
	ReplayAllocation float64  `json:"replay_allocation"`
	SameNode         int      `json:"same_node"` // arrivals on the replay's node, or not placed by either
	Differences      []string `json:"differences"`
	SchedulerErrors  int      `json:"scheduler_errors"` // PodScheduled=False with a reason other than Unschedulable
	LateBinds        int      `json:"late_binds"`       // found unschedulable, then bound before its delete
	Seconds          float64  `json:"seconds"`
	P50Ms            float64  `json:"p50_ms"` // per arrival: create -> bound or unschedulable
	P99Ms            float64  `json:"p99_ms"`
}

// podOutcome is what the scheduler made of a pod: bound to node, or failed (PodScheduled=False)
// with reason and message.
type podOutcome struct {
	node, reason, message string
	gone                  bool
}

func outcomeOf(p *corev1.Pod) (podOutcome, bool) {
	if p.Spec.NodeName != "" {
		return podOutcome{node: p.Spec.NodeName}, true
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return podOutcome{reason: c.Reason, message: c.Message}, true
		}
	}
	return podOutcome{}, false
}

// runReplay places a setup's arrivals through the real scheduler in arrival order, one at a time
// as the replay does: each pod is created, and the next only once it is bound or unschedulable;
// an unschedulable pod is deleted (the replay drops it) before the next is created.
func runReplay(args []string) error {
	fs := flag.NewFlagSet("fleet replay", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (default $KUBECONFIG)")
	setupPath := fs.String("setup", "", "the export of gpulet extender replay --compare-placements --export (required)")
	ns := fs.String("namespace", "fleet-replay", "namespace (deleted and made again first)")
	scheduler := fs.String("scheduler", "gpulet-memory", "spec.schedulerName")
	selector := fs.String("node-selector", "", "KEY=VALUE: the pods' spec.nodeSelector (the setup's fleet, e.g. gpulet.io/fleet=replay)")
	limit := fs.Int("pods", 0, "the first N arrivals only (0: all)")
	timeout := fs.Duration("timeout", time.Minute, "give up when one pod is neither bound nor unschedulable after this")
	keep := fs.Bool("keep", false, "leave the pods (default: delete the namespace at the end)")
	_ = fs.Parse(args)
	if *setupPath == "" {
		return errors.New("replay: -setup FILE is required")
	}
	setup, err := loadSetup(*setupPath)
	if err != nil {
		return err
	}
	nodeSelector, err := selectorFlag(*selector)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	arrivals := setup.Arrivals
	if *limit > 0 && *limit < len(arrivals) {
		arrivals = arrivals[:*limit]
	}
	cs, ctx, stop, err := podSession(*kubeconfig, *ns)
	if err != nil {
		return err
	}
	defer stop()

	// One watch over the namespace; what it reports goes to the arrival waiting for it.
	var mu sync.Mutex
	outcomes := map[string]podOutcome{}
	changed := make(chan struct{}, 1)
	note := func(p *corev1.Pod, deleted bool) {
		mu.Lock()
		if deleted {
			o := outcomes[p.Name]
			o.gone = true
			outcomes[p.Name] = o
		} else if o, ok := outcomeOf(p); ok {
			outcomes[p.Name] = o
		}
		mu.Unlock()
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	list, err := cs.CoreV1().Pods(*ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	go func() {
		rv := list.ResourceVersion
		for ctx.Err() == nil {
			w, err := cs.CoreV1().Pods(*ns).Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
			if err != nil {
				time.Sleep(200 * time.Millisecond)
				if l, err := cs.CoreV1().Pods(*ns).List(ctx, metav1.ListOptions{}); err == nil {
					rv = l.ResourceVersion
					for i := range l.Items {
						note(&l.Items[i], false)
					}
				}
				continue
			}
			for ev := range w.ResultChan() {
				if p, ok := ev.Object.(*corev1.Pod); ok {
					rv = p.ResourceVersion
					note(p, ev.Type == watch.Deleted)
				}
			}
		}
	}()
	wait := func(name string, done func(o podOutcome) bool) (podOutcome, error) {
		end := time.After(*timeout)
		for {
			mu.Lock()
			o := outcomes[name]
			mu.Unlock()
			if done(o) {
				return o, nil
			}
			select {
			case <-changed:
			case <-time.After(100 * time.Millisecond): // a note taken before this wait began
			case <-end:
				return o, fmt.Errorf("pod %s: no outcome after %s (%+v)", name, *timeout, o)
			case <-ctx.Done():
				return o, ctx.Err()
			}
		}
	}

	r := replayResult{Pods: len(arrivals), CapacityUnits: setup.Replay.CapacityUnits, Differences: []string{}}
	lat := make([]time.Duration, 0, len(arrivals))
	t0 := time.Now()
	for i, a := range arrivals {
		p := fleetPod(a.Name, *ns, *scheduler, nodeSelector, corev1.ResourceName(setup.Resource), a.Units)
		if len(a.Models) > 0 {
			p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: modelLabel, Operator: corev1.NodeSelectorOpIn, Values: a.Models}}}}}}}
		}
		start := time.Now()
		if _, err := cs.CoreV1().Pods(*ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create %s: %w", a.Name, err)
		}
		o, err := wait(a.Name, func(o podOutcome) bool { return o.node != "" || o.reason != "" })
		if err != nil {
			return err
		}
		lat = append(lat, time.Since(start))
		if o.node == "" {
			if o.reason != corev1.PodReasonUnschedulable {
				r.SchedulerErrors++
				logf("%s: %s: %s", a.Name, o.reason, o.message)
			}
			zero := int64(0)
			if err := cs.CoreV1().Pods(*ns).Delete(ctx, a.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
				return fmt.Errorf("delete %s: %w", a.Name, err)
			}
			if o, err = wait(a.Name, func(o podOutcome) bool { return o.gone }); err != nil {
				return err
			}
			if o.node != "" {
				r.LateBinds++
				o.node = ""
			}
		}
		if o.node != "" {
			r.Placed++
			r.PlacedUnits += a.Units
		} else {
			r.Failed++
		}
		if o.node == a.Replay.Node {
			r.SameNode++
		} else if len(r.Differences) < 10 {
			r.Differences = append(r.Differences, fmt.Sprintf("%s: scheduler %q, replay %q", a.Name, o.node, a.Replay.Node))
		}
		if (i+1)%100 == 0 {
			logf("%d of %d arrivals: %d placed, %d on the replay's node", i+1, len(arrivals), r.Placed, r.SameNode)
		}
	}
	r.Seconds = time.Since(t0).Seconds()
	for _, a := range arrivals {
		if a.Replay.Node != "" {
			r.ReplayPlaced++
		}
	}
	if r.CapacityUnits > 0 {
		r.Allocation = float64(r.PlacedUnits) / float64(r.CapacityUnits)
		var replayUnits int64
		for _, a := range arrivals {
			if a.Replay.Node != "" {
				replayUnits += a.Units
			}
		}
		r.ReplayAllocation = float64(replayUnits) / float64(r.CapacityUnits)
	}
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	r.P50Ms, r.P99Ms = percentile(lat, 0.50), percentile(lat, 0.99)
	return finish(r, cs, *ns, *keep)
}

// fleetPod: one container asking `amount` of `res` (a limit; the API server sets the request),
// for `scheduler`, on the nodes `selector` picks; gone at once when deleted (no kubelet).
func fleetPod(name, ns, scheduler string, selector map[string]string, res corev1.ResourceName, amount int64) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			SchedulerName:                 scheduler,
			NodeSelector:                  selector,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "main", Image: "localhost/gpulet/test:test",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					res: *resource.NewQuantity(amount, resource.DecimalSI)}}}},
		},
	}
}

// finish prints the result as one JSON line and, unless keep, deletes the namespace.
func finish(result any, cs *kubernetes.Clientset, ns string, keep bool) error {
	out, _ := json.Marshal(result)
	fmt.Println(string(out))
	if keep {
		return nil
	}
	bg, cancel := context.WithTimeout(context.Background(), namespaceGone)
	defer cancel()
	return deleteNamespace(bg, cs, ns)
}

// podSession: the API client, a context SIGTERM/SIGINT ends, and namespace ns made fresh.
func podSession(kubeconfig, ns string) (*kubernetes.Clientset, context.Context, context.CancelFunc, error) {
	cs, err := client(kubeconfig, 2000, 4000)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	if err := freshNamespace(ctx, cs, ns); err != nil {
		stop()
		return nil, nil, nil, err
	}
	return cs, ctx, stop, nil
}

// selectorFlag reads -node-selector KEY=VALUE ("": none).
func selectorFlag(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return nil, fmt.Errorf("-node-selector KEY=VALUE, got %q", s)
	}
	return map[string]string{k: v}, nil
}

func freshNamespace(ctx context.Context, cs *kubernetes.Clientset, ns string) error {
	if err := deleteNamespace(ctx, cs, ns); err != nil {
		return err
	}
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("namespace %s: %w", ns, err)
	}
	// Pods are refused until the namespace's default ServiceAccount exists (the ServiceAccount
	// admission plugin), which the controller-manager makes.
	for end := time.Now().Add(time.Minute); ; {
		if _, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("namespace %s: no default ServiceAccount after 1m", ns)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// namespaceGone bounds the wait for a deleted namespace. Allocated ResourceClaims keep theirs
// until kube-controller-manager (its client: 20 requests/s) has taken each claim's deleted pod out
// of status.reservedFor and then its finalizer off: about 100 s for 1,000 claims.
const namespaceGone = 10 * time.Minute

// deleteNamespace deletes ns and waits until it is gone. Pods bound to fleet nodes have no kubelet
// to confirm their end, so they are deleted with grace period 0 first (what the API server then
// removes at once).
func deleteNamespace(ctx context.Context, cs *kubernetes.Clientset, ns string) error {
	zero := int64(0)
	err := cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pods in %s: %w", ns, err)
	}
	err = cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete namespace %s: %w", ns, err)
	}
	for end := time.Now().Add(namespaceGone); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if _, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return nil
		}
	}
	return fmt.Errorf("namespace %s still exists after %s", ns, namespaceGone)
}
