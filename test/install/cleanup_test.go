package install

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// withoutHooks drops the chart's Helm hook objects (the uninstall cleanup),
// which config/default has no counterpart for.
func withoutHooks(objs []object) []object {
	var out []object
	for _, o := range objs {
		meta, _ := o["metadata"].(map[string]any)
		annotations, _ := meta["annotations"].(map[string]any)
		if _, hook := annotations["helm.sh/hook"]; !hook {
			out = append(out, o)
		}
	}
	return out
}

// TestChartCleanupHook: by default the chart renders the uninstall cleanup as
// a pre-delete hook Job running `manager uninstall` as its own service
// account; cleanup.enabled=false renders none of it.
func TestChartCleanupHook(t *testing.T) {
	root := repoRoot(t)
	objs := parse(t, renderChart(t, root))
	job := find(t, objs, "Job fencekeeper-system/fencekeeper-cleanup")
	if h := job["metadata"].(map[string]any)["annotations"].(map[string]any)["helm.sh/hook"]; h != "pre-delete" {
		t.Errorf("cleanup Job hook %v, want pre-delete", h)
	}
	pod := job["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	args := toStrings(pod["containers"].([]any)[0].(map[string]any)["args"])
	if len(args) == 0 || args[0] != "uninstall" || pod["serviceAccountName"] != "fencekeeper-cleanup" {
		t.Errorf("cleanup Job runs %v as %v; want manager uninstall as fencekeeper-cleanup", args, pod["serviceAccountName"])
	}
	for _, k := range []string{"ServiceAccount fencekeeper-system/fencekeeper-cleanup", "ClusterRole /fencekeeper-cleanup", "ClusterRoleBinding /fencekeeper-cleanup",
		"Role fencekeeper-system/fencekeeper-cleanup", "RoleBinding fencekeeper-system/fencekeeper-cleanup"} {
		find(t, objs, k)
	}
	for _, o := range parse(t, renderChart(t, root, "cleanup.enabled=false")) {
		if strings.Contains(key(o), "fencekeeper-cleanup") {
			t.Errorf("cleanup.enabled=false still renders %s", key(o))
		}
	}
}

// TestEmergencyAndUninstall installs the chart on a bare local cluster (as
// TestREADMEInstall does), then:
//
//  1. kills every operator replica: writes in the enrolled namespace are
//     refused, writes in kube-system and kube-public are not;
//  2. runs docs/troubleshooting.md's "Every operator replica is gone" steps
//     verbatim: writes go through; then its way back: the operator returns,
//     restores failurePolicy Fail, and an unfenced write is refused again;
//  3. runs `helm uninstall` while a replica runs, playing the kubelet for the
//     pre-delete hook Job and the Deployment controller for the scale to 0,
//     and checks nothing is left: no webhook configuration, policy or
//     binding, no enrollment label, no LockGrant finalizer; the CRDs, deleted,
//     go away.
func TestEmergencyAndUninstall(t *testing.T) {
	ctrllog.SetLogger(logr.Discard())
	root := repoRoot(t)
	commands := readmeInstallCommands(t, root)
	if len(commands) != 2 || !strings.HasPrefix(commands[1], "helm install") {
		t.Fatalf("the README's install block has changed (want its second command to be helm install): %q", commands)
	}
	bin := t.TempDir()
	for name, pkg := range map[string]string{"fencekeeper-dev": "./cmd/dev", "manager": "./cmd/manager", "kubectl-fence": "./cmd/kubectl-fence"} {
		run(t, nil, "go", "build", "-C", root, "-o", filepath.Join(bin, name), pkg)
	}
	if err := os.Symlink(helm(t, root), filepath.Join(bin, "helm")); err != nil {
		t.Fatal(err)
	}
	open, back := emergencyBlocks(t, root)
	c := startBareDev(t, root, bin)
	shell(t, c, commands[1])
	r := c.startReplica(t, bin)
	c.tour(t)

	// 1. Every replica is gone.
	r.stop(syscall.SIGKILL)
	eventuallyShell(t, c, "kubectl -n billing create configmap scratch --from-literal=a=b", func(out string, err error) bool {
		return err != nil && strings.Contains(out, "failed calling webhook")
	}, "a write in the enrolled namespace billing is refused with no replica")
	shell(t, c, "kubectl -n kube-system create configmap fencekeeper-exempt --from-literal=a=b")
	shell(t, c, "kubectl -n kube-public create configmap fencekeeper-exempt --from-literal=a=b")
	shell(t, c, "kubectl -n kube-public label configmap fencekeeper-exempt fencekeeper.dev/protected=true")

	// 2. The emergency procedure, then back to fenced.
	for _, line := range open {
		shell(t, c, line)
	}
	eventuallyShell(t, c, "kubectl -n billing create configmap scratch --from-literal=a=b", func(_ string, err error) bool { return err == nil },
		"a write in billing goes through once the webhooks are open")
	shell(t, c, "kubectl apply -f config/samples/invoice-batch-configmap.yaml") // unfenced: fencing is off
	for _, line := range back {
		switch {
		case strings.Contains(line, "rollout status"):
			r = c.startReplica(t, bin) // what the rollout waits for
		case strings.Contains(line, "failurePolicy}"):
			eventuallyShell(t, c, line, func(out string, err error) bool { return err == nil && strings.TrimSpace(out) == "Fail Fail Fail Fail" },
				"the returning operator restores failurePolicy Fail")
		default:
			shell(t, c, line)
		}
	}
	eventuallyShell(t, c, `kubectl -n billing patch configmap invoice-batch-2026-07-19 --type merge -p '{"data":{"after":"back"}}'`, func(out string, err error) bool {
		return err != nil && strings.Contains(out, "FENCE_REQUIRED")
	}, "an unfenced write of the protected ConfigMap is refused again")

	// 3. Uninstall while the replica runs.
	c.uninstall(t, bin, r)
	c.checkNothingLeft(t)
}

// emergencyBlocks are the first and the last sh block of troubleshooting.md's
// "Every operator replica is gone": open the webhooks, and back to fenced.
func emergencyBlocks(t *testing.T, root string) (open, back []string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "docs", "troubleshooting.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Every operator replica is gone\n")
	if !ok {
		t.Fatal(`docs/troubleshooting.md has no "## Every operator replica is gone" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var blocks [][]string
	for _, part := range strings.Split(section, "```sh\n")[1:] {
		block, _, _ := strings.Cut(part, "```")
		var lines []string
		for _, l := range strings.Split(block, "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
		blocks = append(blocks, lines)
	}
	if len(blocks) < 2 {
		t.Fatalf("the emergency section has %d sh blocks; want the way out first and the way back last", len(blocks))
	}
	return blocks[0], blocks[len(blocks)-1]
}

// eventuallyShell runs line until done says so (a minute at most: a
// returning replica first waits for the killed leader's Lease to expire).
func eventuallyShell(t *testing.T, c *devCluster, line string, done func(string, error) bool, what string) {
	t.Helper()
	var out string
	var err error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
		if out, err = tryShell(c, line); done(out, err) {
			return
		}
	}
	t.Fatalf("%s: %s gave (%v)\n%s", what, line, err, out)
}

// replica is one manager process the test runs as the kubelet would.
type replica struct {
	cmd    *exec.Cmd
	exited chan struct{}
	log    string
}

func (r *replica) stop(sig syscall.Signal) {
	_ = r.cmd.Process.Signal(sig)
	<-r.exited
}

// startReplica is runManagerPod with a handle: the test stops and starts
// replicas. It (re)publishes the webhook Service's EndpointSlice.
func (c *devCluster) startReplica(t *testing.T, bin string) *replica {
	t.Helper()
	p := c.managerPod(t)
	r := &replica{cmd: exec.Command(filepath.Join(bin, "manager"), p.args...), exited: make(chan struct{}), log: filepath.Join(p.dir, "manager.log")}
	r.cmd.Env = p.env
	logs, err := os.Create(r.log)
	if err != nil {
		t.Fatal(err)
	}
	r.cmd.Stdout, r.cmd.Stderr = logs, logs
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.cmd.Wait(); close(r.exited) }()
	t.Cleanup(func() {
		r.stop(syscall.SIGTERM)
		if t.Failed() {
			data, _ := os.ReadFile(r.log)
			t.Logf("manager replica:\n%s", tail(data, 40))
		}
	})
	c.republishEndpoint(t, p.namespace, p.webhookPort)
	waitReady(t, p.readyURL())
	return r
}

// republishEndpoint points the webhook Service's one endpoint at port.
func (c *devCluster) republishEndpoint(t *testing.T, ns string, port int) {
	t.Helper()
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fencekeeper-webhook-service-pod"}}
	if err := c.admin.Delete(context.Background(), slice); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	c.publishEndpoint(t, ns, port)
}

// uninstall runs helm uninstall and plays the cluster's part: the
// Deployment controller (scaled to 0: the replica stops) and the kubelet
// and Job controller for the cleanup hook (runs its container's command as
// its service account, then marks the Job complete).
func (c *devCluster) uninstall(t *testing.T, bin string, r *replica) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "helm uninstall fencekeeper -n fencekeeper-system --timeout 3m")
	cmd.Dir, cmd.Env = c.root, c.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	ctx := context.Background()
	var job batchv1.Job
	key := client.ObjectKey{Namespace: locksv1.DefaultNamespace, Name: "fencekeeper-cleanup"}
	for deadline := time.Now().Add(time.Minute); c.admin.Get(ctx, key, &job) != nil; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("helm uninstall created no cleanup Job in a minute:\n%s", out.String())
		}
	}
	// The Deployment controller: once the cleanup scales the manager to 0, its replica goes.
	scaledDown := make(chan struct{})
	go func() {
		defer close(scaledDown)
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			var d appsv1.Deployment
			if err := c.admin.Get(ctx, client.ObjectKey{Namespace: locksv1.DefaultNamespace, Name: "fencekeeper-controller-manager"}, &d); err == nil &&
				d.Spec.Replicas != nil && *d.Spec.Replicas == 0 {
				r.stop(syscall.SIGTERM)
				return
			}
		}
	}()
	c.runJob(t, bin, &job)
	<-scaledDown
	if err := <-done; err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out.String())
	}
	t.Logf("helm uninstall:\n%s", out.String())
}

// runJob runs the Job's one container (the manager binary) as its service
// account and records it complete, as the kubelet and the Job controller would.
func (c *devCluster) runJob(t *testing.T, bin string, job *batchv1.Job) {
	t.Helper()
	pod := job.Spec.Template.Spec
	container := pod.Containers[0]
	if len(container.Command) > 0 || !strings.HasSuffix(container.Image, ":"+release(t, c.root)) {
		t.Fatalf("cleanup Job container %s %q: want the manager image's entrypoint", container.Image, container.Command)
	}
	kubeconfig := c.serviceAccountKubeconfig(t, job.Namespace, pod.ServiceAccountName, t.TempDir())
	start := metav1.Now()
	cmd := exec.Command(filepath.Join(bin, "manager"), container.Args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	out, err := cmd.CombinedOutput()
	t.Logf("cleanup Job (manager %s):\n%s", strings.Join(container.Args, " "), out)
	if err != nil {
		t.Fatalf("the cleanup Job's command failed: %v", err)
	}
	now := metav1.Now()
	job.Status.StartTime, job.Status.CompletionTime, job.Status.Succeeded = &start, &now, 1
	job.Status.Conditions = []batchv1.JobCondition{
		{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now},
		{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now},
	}
	if err := c.admin.Status().Update(context.Background(), job); err != nil {
		t.Fatalf("mark the cleanup Job complete: %v", err)
	}
}

// checkNothingLeft: the uninstall left nothing of fencekeeper's behind that
// would act or hang: webhook configuration, policy, binding, enrollment
// labels, LockGrant finalizers; the hook's own RBAC is gone, and the CRDs,
// deleted, disappear.
func (c *devCluster) checkNothingLeft(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	var cfgs admissionregistrationv1.ValidatingWebhookConfigurationList
	if err := c.admin.List(ctx, &cfgs); err != nil {
		t.Fatal(err)
	}
	for _, cfg := range cfgs.Items {
		t.Errorf("webhook configuration %s is left", cfg.Name)
	}
	for _, obj := range []client.Object{
		&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "fencekeeper-trust-anchors"}},
		&admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "fencekeeper-trust-anchors"}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "fencekeeper-cleanup"}},
	} {
		if err := c.admin.Get(ctx, client.ObjectKeyFromObject(obj), obj); !apierrors.IsNotFound(err) {
			t.Errorf("%T %s is left (%v)", obj, obj.GetName(), err)
		}
	}
	var nss corev1.NamespaceList
	if err := c.admin.List(ctx, &nss, client.HasLabels{locksv1.LabelEnrolledNamespace}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range nss.Items {
		t.Errorf("namespace %s still carries %s", ns.Name, locksv1.LabelEnrolledNamespace)
	}
	var grants locksv1.LockGrantList
	if err := c.admin.List(ctx, &grants); err != nil {
		t.Fatal(err)
	}
	if len(grants.Items) == 0 {
		t.Error("the tour left no LockGrant: the finalizer check proves nothing")
	}
	for _, lg := range grants.Items {
		if len(lg.Finalizers) > 0 {
			t.Errorf("LockGrant %s/%s still has finalizers %v", lg.Namespace, lg.Name, lg.Finalizers)
		}
	}
	shell(t, c, "kubectl delete crd fencedresources.locks.fencekeeper.dev lockgrants.locks.fencekeeper.dev --wait=false")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(300 * time.Millisecond) {
		crds := &metav1.PartialObjectMetadataList{}
		crds.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinitionList"))
		if err := c.admin.List(ctx, crds); err != nil {
			t.Fatal(err)
		}
		var left []string
		for _, crd := range crds.Items {
			if strings.HasSuffix(crd.Name, "."+locksv1.GroupVersion.Group) {
				left = append(left, fmt.Sprintf("%s (finalizers %v)", crd.Name, crd.Finalizers))
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the CRDs are not gone a minute after their deletion: %v", left)
		}
	}
}
