//go:build kubernetes_protomessage_one_more_release

// Golden BestOptionsRequest bytes for tests/test_autoscaler_expander_shapes.py, made the way cluster-autoscaler's
// gRPC expander client (expander/grpcplugin/grpc_client.go) makes them in each of its three generations:
//
//	before 1.34.3   Option.pod = 4 (repeated v1.Pod), BestOptionsRequest.nodeMap = 2 (map<string, v1.Node>)
//	1.34.3-1.34.x   both the old fields and Option.podBytes = 5 / BestOptionsRequest.nodeBytesMap = 3
//	1.35+           only podBytes = 5 / nodeBytesMap = 3, each value pod.Marshal() / node.Marshal()
//
// The Pod and Node objects are real k8s.io/api v0.35.8 types and their bytes come from their own Marshal(): this is
// the independent encoder our minimal decoding messages are checked against. The request envelope is marshalled by
// google.golang.org/protobuf from Go structs carrying the same protobuf struct tags protoc-gen-go writes for CA's
// expander.proto (field names, numbers and types only, written here from that field list), so the old shape's
// embedded v1.Pod / v1.Node go through the same legacy-message path CA's generated code used. The build tag gives
// the v0.35.8 types back their ProtoMessage() marker (removed by default in 1.35), as the pre-1.35 types had it.
//
// Regenerate (writes *.bin and manifest.json next to this file):
//
//	cd tests/golden/ca_expander && GOMODCACHE=~/.cache/kube-qos-extender/go/mod GOFLAGS=-mod=mod \
//	    go run -tags kubernetes_protomessage_one_more_release .
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/runtime/protoiface"
	"google.golang.org/protobuf/runtime/protoimpl"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ---------------------------------------------------------------- the request messages, one struct per CA generation

type optionOld struct {
	NodeGroupId string        `protobuf:"bytes,1,opt,name=nodeGroupId,proto3"`
	NodeCount   int32         `protobuf:"varint,2,opt,name=nodeCount,proto3"`
	Debug       string        `protobuf:"bytes,3,opt,name=debug,proto3"`
	Pod         []*corev1.Pod `protobuf:"bytes,4,rep,name=pod,proto3"`
}

type requestOld struct {
	Options []*optionOld            `protobuf:"bytes,1,rep,name=options,proto3"`
	NodeMap map[string]*corev1.Node `protobuf:"bytes,2,rep,name=nodeMap,proto3" protobuf_key:"bytes,1,opt,name=key,proto3" protobuf_val:"bytes,2,opt,name=value,proto3"`
}

type optionBoth struct {
	NodeGroupId string        `protobuf:"bytes,1,opt,name=nodeGroupId,proto3"`
	NodeCount   int32         `protobuf:"varint,2,opt,name=nodeCount,proto3"`
	Debug       string        `protobuf:"bytes,3,opt,name=debug,proto3"`
	Pod         []*corev1.Pod `protobuf:"bytes,4,rep,name=pod,proto3"`
	PodBytes    [][]byte      `protobuf:"bytes,5,rep,name=podBytes,proto3"`
}

type requestBoth struct {
	Options      []*optionBoth           `protobuf:"bytes,1,rep,name=options,proto3"`
	NodeMap      map[string]*corev1.Node `protobuf:"bytes,2,rep,name=nodeMap,proto3" protobuf_key:"bytes,1,opt,name=key,proto3" protobuf_val:"bytes,2,opt,name=value,proto3"`
	NodeBytesMap map[string][]byte       `protobuf:"bytes,3,rep,name=nodeBytesMap,proto3" protobuf_key:"bytes,1,opt,name=key,proto3" protobuf_val:"bytes,2,opt,name=value,proto3"`
}

type optionNew struct {
	NodeGroupId string   `protobuf:"bytes,1,opt,name=nodeGroupId,proto3"`
	NodeCount   int32    `protobuf:"varint,2,opt,name=nodeCount,proto3"`
	Debug       string   `protobuf:"bytes,3,opt,name=debug,proto3"`
	PodBytes    [][]byte `protobuf:"bytes,5,rep,name=podBytes,proto3"`
}

type requestNew struct {
	Options      []*optionNew      `protobuf:"bytes,1,rep,name=options,proto3"`
	NodeBytesMap map[string][]byte `protobuf:"bytes,3,rep,name=nodeBytesMap,proto3" protobuf_key:"bytes,1,opt,name=key,proto3" protobuf_val:"bytes,2,opt,name=value,proto3"`
}

// protoiface.MessageV1, so protoimpl can wrap the structs (their descriptors are derived from the struct tags)
func (*optionOld) Reset()          {}
func (*optionOld) String() string  { return "optionOld" }
func (*optionOld) ProtoMessage()   {}
func (*requestOld) Reset()         {}
func (*requestOld) String() string { return "requestOld" }
func (*requestOld) ProtoMessage()  {}
func (*optionBoth) Reset()         {}
func (*optionBoth) String() string { return "optionBoth" }
func (*optionBoth) ProtoMessage()  {}
func (*requestBoth) Reset()        {}
func (*requestBoth) String() string {
	return "requestBoth"
}
func (*requestBoth) ProtoMessage() {}
func (*optionNew) Reset()          {}
func (*optionNew) String() string  { return "optionNew" }
func (*optionNew) ProtoMessage()   {}
func (*requestNew) Reset()         {}
func (*requestNew) String() string { return "requestNew" }
func (*requestNew) ProtoMessage()  {}

// ------------------------------------------------------------------------------------- the objects CA would send

var created = metav1.NewTime(time.Date(2026, 1, 15, 10, 30, 0, 0, time.UTC))

func q(s string) resource.Quantity { return resource.MustParse(s) }

// a pending pod of a Deployment, as the API server stores it after admission: most fields are ones we do not read
func pod(i int) *corev1.Pod {
	name := fmt.Sprintf("web-7d9c5-%d", i)
	p := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{
			Name:              name,
			GenerateName:      "web-7d9c5-",
			Namespace:         "shop",
			UID:               types.UID(fmt.Sprintf("6f1c0c1e-0000-4000-8000-00000000000%d", i)),
			ResourceVersion:   fmt.Sprintf("%d", 4242+i),
			CreationTimestamp: created,
			Labels:            map[string]string{"app": "web", "pod-template-hash": "7d9c5"},
			Annotations: map[string]string{
				"qos.kube-qos-extender.io/class":    "silver",
				"qos.kube-qos-extender.io/kind":     "service",
				"kubectl.kubernetes.io/restartedAt": "2026-01-15T10:29:00Z",
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-7d9c5",
				UID: "0b0b0b0b-1111-4222-8333-444444444444", Controller: ptr(true), BlockOwnerDeletion: ptr(true),
			}},
			ManagedFields: []metav1.ManagedFieldsEntry{{
				Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
				Time: &created, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{}}`)},
			}},
		},
		Spec: corev1.PodSpec{
			Volumes: []corev1.Volume{{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			Containers: []corev1.Container{{
				Name:    "app",
				Image:   "registry.example/web:1.4.2",
				Command: []string{"/web", "--port=8080"},
				Ports:   []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
				Env:     []corev1.EnvVar{{Name: "MODE", Value: "prod"}},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{"cpu": q("250m"), "memory": q("3Gi")},
					Limits:   corev1.ResourceList{"memory": q("3Gi")},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "cache", MountPath: "/cache"}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
					HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")},
				}},
				TerminationMessagePath:   "/dev/termination-log",
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				ImagePullPolicy:          corev1.PullIfNotPresent,
			}},
			RestartPolicy:                 corev1.RestartPolicyAlways,
			TerminationGracePeriodSeconds: ptr(int64(30)),
			DNSPolicy:                     corev1.DNSClusterFirst,
			NodeSelector:                  map[string]string{"kubernetes.io/os": "linux"},
			ServiceAccountName:            "default",
			SchedulerName:                 "qos-scheduler",
			PriorityClassName:             "shop-normal",
			Priority:                      ptr(int32(100)),
			Tolerations: []corev1.Toleration{{
				Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists,
				Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr(int64(300)),
			}},
			Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
				PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
					Weight: 10, PodAffinityTerm: corev1.PodAffinityTerm{
						LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
						TopologyKey:   "kubernetes.io/hostname",
					},
				}},
			}},
			EnableServiceLinks: ptr(true),
			PreemptionPolicy:   ptr(corev1.PreemptLowerPriority),
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodPending,
			Conditions: []corev1.PodCondition{{
				Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable",
				Message:            "0/3 nodes are available: 3 Insufficient memory.",
				LastTransitionTime: created,
			}},
			QOSClass: corev1.PodQOSBurstable,
		},
	}
	if i == 0 { // a native sidecar (restartPolicy Always init container) and RuntimeClass overhead: both count
		p.Spec.InitContainers = []corev1.Container{{
			Name: "proxy", Image: "registry.example/proxy:2", RestartPolicy: ptr(corev1.ContainerRestartPolicyAlways),
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"cpu": q("50m"), "memory": q("64Mi")}},
		}}
		p.Spec.Overhead = corev1.ResourceList{"cpu": q("10m"), "memory": q("32Mi")}
		p.Spec.RuntimeClassName = ptr("kata")
	}
	return p
}

type group struct {
	id, flavour, cpu, memory, price string
	count                           int32
}

// node groups in CA's order; the template node is what CA's nodeInfo.Node() holds for the group
var groups = []group{
	{"ng-small", "s.small", "2", "4Gi", "", 5},
	{"ng-large", "s.large", "8", "16Gi", "", 1},
	{"ng-himem", "s.himem", "2", "16Gi", "", 1},
	{"ng-other", "x.unknown", "4", "32Gi", "1.50", 1}, // not in our catalogue: priced by the annotation
}

func node(g group) *corev1.Node {
	name := "template-node-for-" + g.id + "-8475439143436711981"
	n := &corev1.Node{
		TypeMeta: metav1.TypeMeta{Kind: "Node", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux", "kubernetes.io/hostname": name,
				"node.kubernetes.io/instance-type": g.flavour, "topology.kubernetes.io/zone": "zone-a",
			},
			Annotations:       map[string]string{"node.alpha.kubernetes.io/ttl": "0"},
			CreationTimestamp: created,
		},
		Spec: corev1.NodeSpec{
			ProviderID: "externalgrpc://" + g.id + "/template",
			Taints:     []corev1.Taint{{Key: "example.com/dedicated", Value: "shop", Effect: corev1.TaintEffectPreferNoSchedule}},
		},
		Status: corev1.NodeStatus{
			Capacity: corev1.ResourceList{
				"cpu": q(g.cpu), "memory": q(g.memory), "pods": q("110"), "ephemeral-storage": q("100Gi"),
			},
			Allocatable: corev1.ResourceList{
				"cpu": q(g.cpu), "memory": q(g.memory), "pods": q("110"), "ephemeral-storage": q("95Gi"),
			},
			Phase: corev1.NodeRunning,
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: created, LastTransitionTime: created,
			}},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.7"}},
			NodeInfo:  corev1.NodeSystemInfo{KubeletVersion: "v1.35.8", OperatingSystem: "linux", Architecture: "amd64"},
			Images:    []corev1.ContainerImage{{Names: []string{"registry.example/web:1.4.2"}, SizeBytes: 52428800}},
		},
	}
	if g.price != "" {
		n.Annotations["qos.kube-qos-extender.io/price-per-hour"] = g.price
	}
	return n
}

func ptr[T any](v T) *T { return &v }

// -------------------------------------------------------------------------------------------------- the requests

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func marshal(m protoiface.MessageV1) []byte {
	// grpc-go's proto codec does proto.Marshal(request); Deterministic only fixes the order of the map entries
	// (random otherwise), so that regenerating gives the same files
	return must(proto.MarshalOptions{Deterministic: true}.Marshal(protoimpl.X.ProtoMessageV2Of(m)))
}

func debug(g group) string { return fmt.Sprintf("%s: %d node(s) help 5 pod(s)", g.id, g.count) }

func main() {
	pods := []*corev1.Pod{}
	podBytes := [][]byte{}
	for i := range 5 {
		p := pod(i)
		pods = append(pods, p)
		podBytes = append(podBytes, must(p.Marshal()))
	}
	nodes := map[string]*corev1.Node{}
	nodeBytes := map[string][]byte{}
	for _, g := range groups {
		nodes[g.id] = node(g)
		nodeBytes[g.id] = must(nodes[g.id].Marshal())
	}

	// The embedded-message path CA < 1.35 took for fields 2/4 must give exactly Marshal()'s bytes: check it once.
	wrapped := marshal(&optionOld{Pod: pods[:1]})
	num, typ, n := protowire.ConsumeTag(wrapped)
	embedded, m := protowire.ConsumeBytes(wrapped[n:])
	if num != 4 || typ != protowire.BytesType || n+m != len(wrapped) || !bytes.Equal(embedded, podBytes[0]) {
		panic("legacy-wrapped v1.Pod in Option.pod does not marshal to pod.Marshal()")
	}

	old := &requestOld{NodeMap: nodes}
	both := &requestBoth{NodeMap: nodes, NodeBytesMap: nodeBytes}
	now := &requestNew{NodeBytesMap: nodeBytes}
	for _, g := range groups {
		old.Options = append(old.Options, &optionOld{g.id, g.count, debug(g), pods})
		both.Options = append(both.Options, &optionBoth{g.id, g.count, debug(g), pods, podBytes})
		now.Options = append(now.Options, &optionNew{g.id, g.count, debug(g), podBytes})
	}
	files := map[string][]byte{
		"request-ca-1.34.2.bin": marshal(old),  // before 1.34.3: fields 2 and 4 only
		"request-ca-1.34.3.bin": marshal(both), // 1.34.3-1.34.x: old and new fields, same objects
		"request-ca-1.35.0.bin": marshal(now),  // 1.35+: fields 3 and 5 only
	}
	for name, data := range files {
		must(0, os.WriteFile(name, data, 0o644))
	}

	// What the Go types say about the same objects, for the test to compare our decoding with.
	type podFacts struct {
		Namespace, Name, UID, SchedulerName, Phase string
		Priority                                   int32
		Labels, Annotations                        map[string]string
		ControllerKind, ControllerName             string
		Containers, InitContainers                 []map[string]int64
		SidecarInit                                []bool
		Overhead                                   map[string]int64
	}
	type nodeFacts struct {
		Name                string
		Labels, Annotations map[string]string
		Allocatable         map[string]int64
		Capacity            map[string]int64
	}
	amounts := func(l corev1.ResourceList) map[string]int64 {
		out := map[string]int64{}
		for k, v := range l {
			if k == corev1.ResourceCPU {
				out[string(k)] = v.MilliValue()
			} else {
				out[string(k)] = v.Value()
			}
		}
		return out
	}
	manifest := struct {
		Generator, KubernetesAPI string
		Groups                   []map[string]any
		Pods                     []podFacts
		Nodes                    map[string]nodeFacts
		RequestSizes             map[string]int
	}{RequestSizes: map[string]int{}, Generator: "tests/golden/ca_expander/main.go", KubernetesAPI: "k8s.io/api v0.35.8", Nodes: map[string]nodeFacts{}}
	for _, g := range groups {
		manifest.Groups = append(manifest.Groups, map[string]any{"id": g.id, "count": g.count, "debug": debug(g)})
		n := nodes[g.id]
		manifest.Nodes[g.id] = nodeFacts{n.Name, n.Labels, n.Annotations, amounts(n.Status.Allocatable), amounts(n.Status.Capacity)}
	}
	for _, p := range pods {
		f := podFacts{
			Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), SchedulerName: p.Spec.SchedulerName,
			Phase: string(p.Status.Phase), Priority: *p.Spec.Priority, Labels: p.Labels, Annotations: p.Annotations,
			ControllerKind: p.OwnerReferences[0].Kind, ControllerName: p.OwnerReferences[0].Name,
			Overhead: amounts(p.Spec.Overhead),
		}
		for _, c := range p.Spec.Containers {
			f.Containers = append(f.Containers, amounts(c.Resources.Requests))
		}
		for _, c := range p.Spec.InitContainers {
			f.InitContainers = append(f.InitContainers, amounts(c.Resources.Requests))
			f.SidecarInit = append(f.SidecarInit, c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways)
		}
		manifest.Pods = append(manifest.Pods, f)
	}
	names := make([]string, 0, len(files))
	for name, data := range files {
		names = append(names, name)
		manifest.RequestSizes[name] = len(data)
	}
	sort.Strings(names)
	out := must(json.MarshalIndent(manifest, "", "  "))
	must(0, os.WriteFile("manifest.json", append(out, '\n'), 0o644))
	fmt.Println("wrote", names, "manifest.json")
}
