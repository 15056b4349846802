package envtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/fencectl"
	"github.com/fencekeeper/fencekeeper/internal/version"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/webhooks"
)

// fencectlResult is one run of the kubectl fence plugin.
type fencectlResult struct {
	code           int
	stdout, stderr string
}

// kubectlFence runs the plugin in-process as the user of cfg, through a
// kubeconfig file as a person would: the flags the plugin shares with kubectl
// (--as, --request-timeout, --context, …) act on it as they do for kubectl.
func kubectlFence(cfg *rest.Config, args ...string) fencectlResult {
	var out, errOut bytes.Buffer
	full := append([]string{"--kubeconfig", kubeconfigFor(cfg)}, args...)
	if len(args) > 0 && args[0] == "__complete" {
		// As kubectl_complete-fence is called: __complete first.
		full = append([]string{"__complete", "--kubeconfig", kubeconfigFor(cfg)}, args[1:]...)
	}
	code := fencectl.Run(suiteCtx, full, &out, &errOut)
	GinkgoWriter.Printf("$ kubectl fence %v → %d\n%s%s", args, code, out.String(), errOut.String())
	return fencectlResult{code, out.String(), errOut.String()}
}

var kubeconfigs sync.Map // *rest.Config → path

// kubeconfigFor writes (once) a kubeconfig file with cfg's server and client
// certificate, its context's namespace left unset.
func kubeconfigFor(cfg *rest.Config) string {
	GinkgoHelper()
	if p, ok := kubeconfigs.Load(cfg); ok {
		return p.(string)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "user"}
	kc.CurrentContext = "envtest"
	dir, err := os.MkdirTemp("", "kubeconfig-")
	Expect(err).NotTo(HaveOccurred())
	p := filepath.Join(dir, "config")
	Expect(clientcmd.WriteToFile(*kc, p)).To(Succeed())
	kubeconfigs.Store(cfg, p)
	return p
}

// json decodes the output of a run that succeeded.
func (r fencectlResult) json(v any) {
	GinkgoHelper()
	Expect(r.code).To(Equal(0), r.stderr)
	r.decode(v)
}

func (r fencectlResult) decode(v any) {
	GinkgoHelper()
	Expect(json.Unmarshal([]byte(r.stdout), v)).To(Succeed(), r.stdout)
}

func manifestFile(content string) string {
	p := filepath.Join(GinkgoT().TempDir(), "object.yaml")
	Expect(os.WriteFile(p, []byte(content), 0o600)).To(Succeed())
	return p
}

var _ = Describe("kubectl fence", func() {
	var ns string
	var a, b *rest.Config
	BeforeEach(func() {
		ns = newNamespace()
		a, b = testEnvUserConfig("worker-a"), testEnvUserConfig("worker-b")
	})

	It("acquires, writes, shows status and receipts, renews, hands off, refuses the stale owner and releases", func() {
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		type grantJSON struct {
			Name, Owner string
			Phase       locksv1.LockGrantPhase
			FenceToken  int64
			ExpiresAt   *time.Time
		}
		var ga grantJSON
		kubectlFence(a, "acquire", "batch", "-n", ns, "--request-id", "a1", "-o", "json").json(&ga)
		Expect(ga.Phase).To(Equal(locksv1.PhaseHeld))
		Expect(ga.Owner).To(Equal("worker-a"))
		Expect(ga.FenceToken).To(BeEquivalentTo(1))
		Expect(ga.Name).To(Equal(locksv1.LockGrantName("batch", "worker-a", "a1")))

		// Acquiring the same request again finds the same grant.
		r := kubectlFence(a, "acquire", "batch", "-n", ns, "--request-id", "a1")
		Expect(r.code).To(Equal(0))
		Expect(r.stdout).To(ContainSubstring("LockGrant " + ga.Name + " is Held by worker-a: fence 1"))
		// -o name is kubectl's TYPE/NAME, and every LOCKGRANT argument takes it
		// back (GRANT=$(kubectl fence acquire … -o name); kubectl fence write $GRANT …).
		qualified := kubectlFence(a, "acquire", "batch", "-n", ns, "--request-id", "a1", "-o", "name").stdout
		Expect(qualified).To(Equal("lockgrant.locks.fencekeeper.dev/" + ga.Name + "\n"))
		qualified = strings.TrimSpace(qualified)

		file := manifestFile("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: batch\ndata:\n  status: settling\n")
		var w struct {
			Verdict fence.Verdict
			Fence   int64
			Segment int64
			Receipt string
		}
		kubectlFence(a, "write", qualified, "-f", file, "-n", ns, "-o", "json").json(&w)
		Expect(w.Verdict).To(Equal(fence.Accepted))
		Expect([]int64{w.Fence, w.Segment}).To(Equal([]int64{1, 1}))
		cm := &corev1.ConfigMap{}
		Expect(admin.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: "batch"}, cm)).To(Succeed())
		Expect(cm.Data).To(Equal(map[string]string{"status": "settling"}))

		var rec struct {
			Object       string
			HighestFence int64
			LastSegment  int64
			Receipts     []fence.Receipt
		}
		kubectlFence(adminCfg, "receipts", "fr/batch", "-n", ns, "-o", "json").json(&rec)
		Expect(rec.Object).To(Equal("ConfigMap/batch"))
		Expect(rec.HighestFence).To(BeEquivalentTo(1))
		Expect(rec.Receipts).To(HaveLen(1))
		Expect(rec.Receipts[0].Receipt).To(Equal(w.Receipt))

		// Renewal is confirmed by the issuer.
		var renewed grantJSON
		kubectlFence(a, "renew", ga.Name, "-n", ns, "-o", "json").json(&renewed)
		Expect(renewed.Phase).To(Equal(locksv1.PhaseHeld))
		Expect(getGrant(ns, ga.Name).Status.ObservedRenewals).To(BeEquivalentTo(1))

		// worker-b queues; status shows holder and queue.
		bDone := make(chan fencectlResult, 1)
		go func() {
			defer GinkgoRecover()
			bDone <- kubectlFence(b, "acquire", "batch", "-n", ns, "--request-id", "b1", "-o", "json")
		}()
		var st struct {
			FenceToken           int64
			HighestObservedFence int64
			Holder               struct {
				Owner      string
				FenceToken int64
			}
			Queue      []locksv1.QueuedGrant
			Conditions []metav1.Condition
		}
		Eventually(func() []locksv1.QueuedGrant {
			kubectlFence(adminCfg, "status", "batch", "-n", ns, "-o", "json").json(&st)
			return st.Queue
		}, 10*time.Second, 100*time.Millisecond).Should(HaveLen(1))
		Expect(st.Queue[0].Owner).To(Equal("worker-b"))
		Expect(st.Holder.Owner).To(Equal("worker-a"))
		Expect(st.Holder.FenceToken).To(BeEquivalentTo(1))
		Expect(st.FenceToken).To(BeEquivalentTo(1))
		Expect(st.Conditions).NotTo(BeEmpty())
		text := kubectlFence(adminCfg, "status", "-n", ns)
		Expect(text.stdout).To(ContainSubstring("holder        worker-a with fence 1"))
		Expect(text.stdout).To(ContainSubstring("1. worker-b"))

		// The issuer expires worker-a; worker-b gets fence 2 and writes.
		primary.step(11 * time.Second)
		var gb grantJSON
		(<-bDone).json(&gb)
		Expect(gb.FenceToken).To(BeEquivalentTo(2))
		fileB := manifestFile(`{"apiVersion":"v1","kind":"ConfigMap","data":{"status":"settled by b"}}`)
		Expect(kubectlFence(b, "write", gb.Name, "-f", fileB, "-n", ns).code).To(Equal(0))

		// worker-a: the client refuses (its grant ended); unguarded, the webhook refuses.
		r = kubectlFence(a, "write", ga.Name, "-f", file, "-n", ns)
		Expect(r.code).To(Equal(1))
		Expect(r.stderr).To(ContainSubstring("grant expired: LockGrant " + ga.Name + " is Expired"))
		r = kubectlFence(a, "write", ga.Name, "-f", file, "-n", ns, "--unguarded")
		Expect(r.code).To(Equal(1))
		Expect(r.stderr).To(ContainSubstring("denied: STALE_OWNER"))
		Expect(r.stderr).To(ContainSubstring("What to do: your grant is no longer the holder"))
		Expect(admin.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: "batch"}, cm)).To(Succeed())
		Expect(cm.Data).To(Equal(map[string]string{"status": "settled by b"}))

		// An expired grant cannot be renewed.
		r = kubectlFence(a, "renew", ga.Name, "-n", ns)
		Expect(r.code).To(Equal(1))
		Expect(r.stderr).To(ContainSubstring("is Expired, not Held"))

		var released grantJSON
		kubectlFence(b, "release", gb.Name, "-n", ns, "-o", "json").json(&released)
		Expect(released.Phase).To(Equal(locksv1.PhaseReleased))
	})

	It("writes a custom resource's spec", func() {
		batch := newTarget(protectedKinds[1], ns, "cr-batch", locksv1.EnforcementEnforce)
		lg := held(ns, "cr-batch", "worker-a", "cr1")
		file := manifestFile("apiVersion: billing.example.com/v1\nkind: InvoiceBatch\nmetadata:\n  name: cr-batch\nspec:\n  result: from kubectl\n")
		for seg := 1; seg <= 2; seg++ {
			r := kubectlFence(a, "write", lg.Name, "-n", ns, "-f", file)
			Expect(r.code).To(Equal(0), r.stderr)
			Expect(r.stdout).To(ContainSubstring(fmt.Sprintf("InvoiceBatch/cr-batch accepted: fence 1, segment %d", seg)))
		}
		Expect(batch.content()).To(Equal("from kubectl"))
	})

	It("explains bad input", func() {
		r := kubectlFence(a, "acquire", "no-such-resource", "-n", ns, "--timeout", "5s")
		Expect(r.code).To(Equal(1))
		Expect(r.stderr).To(ContainSubstring("no-such-resource"))
		r = kubectlFence(a, "status", "nope", "-n", ns)
		Expect(r.code).To(Equal(1))
		Expect(r.stderr).To(ContainSubstring("FencedResource nope not found"))
		r = kubectlFence(a, "status", "-n", ns, "-o", "xml")
		Expect(r.code).To(Equal(1))
		Expect(r.stderr).To(ContainSubstring(`unknown output format "xml"`))
		r = kubectlFence(a, "audit", "-n", ns, "-o", "name")
		Expect(r.code).To(Equal(1))
		Expect(r.stderr).To(ContainSubstring("-o name prints object names: acquire, renew, release and status have them"))
		r = kubectlFence(a, "status", "-n", ns, "-o", "jsonpath={.nope")
		Expect(r.code).To(Equal(1))
		Expect(r.stderr).To(ContainSubstring("jsonpath"))
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		lg := held(ns, "batch", "worker-a", "x1")
		r = kubectlFence(a, "write", lg.Name, "-n", ns)
		Expect(r.stderr).To(ContainSubstring("write needs -f FILE"))
		wrongKind := manifestFile("apiVersion: v1\nkind: Secret\nmetadata:\n  name: batch\n")
		r = kubectlFence(a, "write", lg.Name, "-n", ns, "-f", wrongKind)
		Expect(r.code).To(Equal(1))
		Expect(r.stderr).To(ContainSubstring(`is a v1 "Secret", but FencedResource batch protects a v1 "ConfigMap"`))
		otherNamespace := manifestFile("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: batch\n  namespace: elsewhere\n")
		r = kubectlFence(a, "write", lg.Name, "-n", ns, "-f", otherNamespace)
		Expect(r.stderr).To(ContainSubstring(`is in namespace "elsewhere"`))
		r = kubectlFence(b, "write", lg.Name, "-n", ns, "-f", wrongKind)
		Expect(r.stderr).To(ContainSubstring(`belongs to "worker-a", not to "worker-b"`))
	})

	It("audits protected objects and exits 1 on a gap", func() {
		covered := newTarget(protectedKinds[0], ns, "covered", locksv1.EnforcementEnforce)
		Expect(covered.write(held(ns, "covered", "worker-a", "c1"), 1, "v1")).To(Succeed())
		newTarget(protectedKinds[0], ns, "not-yet", locksv1.EnforcementShadow)

		type auditJSON struct {
			Objects []struct {
				Object         string
				FencedResource string
				Enforcement    locksv1.EnforcementMode
				WebhookCovers  bool
				Exists         bool
				Gaps           []string
			}
			Gaps int
		}
		var rep auditJSON
		kubectlFence(adminCfg, "audit", "-n", ns, "-o", "json").json(&rep)
		Expect(rep.Gaps).To(BeZero())
		Expect(rep.Objects).To(HaveLen(2))
		Expect(rep.Objects[0].Object).To(Equal("ConfigMap/covered"))
		Expect(rep.Objects[0].Exists && rep.Objects[0].WebhookCovers).To(BeTrue())
		Expect(rep.Objects[0].Enforcement).To(Equal(locksv1.EnforcementEnforce))
		Expect(rep.Objects[1].Object).To(Equal("ConfigMap/not-yet"))
		Expect(rep.Objects[1].Exists).To(BeFalse())

		// Shadow is a gap only on request.
		r := kubectlFence(adminCfg, "audit", "-n", ns, "--require-enforce")
		Expect(r.code).To(Equal(1))
		Expect(r.stdout).To(ContainSubstring("enforcement is Shadow"))

		// A target created without the label is still seen: the registry
		// decides, and the namespace holding the entry is enrolled.
		Expect(admin.Create(suiteCtx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "not-yet"}})).To(Succeed())
		rep = auditJSON{}
		kubectlFence(adminCfg, "audit", "-n", ns, "-o", "json").json(&rep)
		Expect(rep.Gaps).To(BeZero())
		Expect(rep.Objects[1].Object).To(Equal("ConfigMap/not-yet"))
		Expect(rep.Objects[1].Exists && rep.Objects[1].WebhookCovers).To(BeTrue())

		// A labeled object where the webhook does not look (the operator's own
		// namespace is excluded by the namespaceSelector), naming no FencedResource.
		hidden := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: opNamespace, Name: "audit-hidden-" + ns,
			Labels: map[string]string{fence.LabelProtected: "true"}}}
		Expect(admin.Create(suiteCtx, hidden)).To(Succeed())
		DeferCleanup(func() { _ = admin.Delete(suiteCtx, hidden) })
		r = kubectlFence(adminCfg, "audit", "-n", opNamespace, "-o", "json")
		Expect(r.code).To(Equal(1))
		rep = auditJSON{}
		r.decode(&rep)
		var gaps []string
		for _, o := range rep.Objects {
			if o.Object == "ConfigMap/"+hidden.Name {
				gaps = o.Gaps
			}
		}
		Expect(gaps).To(ContainElements(
			ContainSubstring("the acceptance webhook does not cover configmaps here"),
			ContainSubstring("is not enrolled"),
			ContainSubstring("no fencekeeper.dev/resource annotation")))
	})

	It("prints -o yaml equal to -o json, -o name as kubectl does, and jsonpath and go-template on the same document", func() {
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		var asJSON, asYAML map[string]any
		kubectlFence(a, "acquire", "batch", "-n", ns, "--request-id", "a1", "-o", "json").json(&asJSON)
		r := kubectlFence(a, "acquire", "batch", "-n", ns, "--request-id", "a1", "-o", "yaml")
		Expect(r.code).To(Equal(0), r.stderr)
		Expect(yaml.Unmarshal([]byte(r.stdout), &asYAML)).To(Succeed(), r.stdout)
		Expect(asYAML).To(Equal(asJSON))
		// The flat fields scripts already parse stay where they were.
		Expect(asJSON).To(HaveKeyWithValue("phase", "Held"))
		Expect(asJSON).To(HaveKeyWithValue("owner", "worker-a"))
		name := asJSON["name"].(string)

		Expect(kubectlFence(a, "renew", name, "-n", ns, "-o", "name").stdout).To(Equal("lockgrant.locks.fencekeeper.dev/" + name + "\n"))
		r = kubectlFence(a, "acquire", "batch", "-n", ns, "--request-id", "a1", "-o", "jsonpath={.status.phase}")
		Expect(r.code).To(Equal(0), r.stderr)
		Expect(r.stdout).To(Equal("Held"))
		r = kubectlFence(a, "acquire", "batch", "-n", ns, "--request-id", "a1", "-o", "go-template={{.spec.owner}} {{.fenceToken}}")
		Expect(r.code).To(Equal(0), r.stderr)
		Expect(r.stdout).To(Equal("worker-a 1"))

		var stJSON, stYAML map[string]any
		kubectlFence(adminCfg, "status", "batch", "-n", ns, "-o", "json").json(&stJSON)
		r = kubectlFence(adminCfg, "status", "batch", "-n", ns, "-o", "yaml")
		Expect(r.code).To(Equal(0), r.stderr)
		Expect(yaml.Unmarshal([]byte(r.stdout), &stYAML)).To(Succeed(), r.stdout)
		Expect(stYAML).To(Equal(stJSON))
		Expect(stJSON).To(HaveKey("holder"))
		Expect(kubectlFence(adminCfg, "status", "-n", ns, "-o", "name").stdout).To(Equal("fencedresource.locks.fencekeeper.dev/batch\n"))
		Expect(kubectlFence(adminCfg, "status", "batch", "-n", ns, "-o", "jsonpath={.holder.owner}").stdout).To(Equal("worker-a"))
		Expect(kubectlFence(adminCfg, "status", "-n", ns, "-o", "jsonpath={[*].name}").stdout).To(Equal("batch"))

		file := manifestFile("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: batch\ndata:\n  k: v\n")
		r = kubectlFence(a, "write", name, "-f", file, "-n", ns, "-o", "yaml")
		Expect(r.code).To(Equal(0), r.stderr)
		var w struct{ Verdict fence.Verdict }
		Expect(yaml.Unmarshal([]byte(r.stdout), &w)).To(Succeed(), r.stdout)
		Expect(w.Verdict).To(Equal(fence.Accepted))
		Expect(kubectlFence(adminCfg, "receipts", "batch", "-n", ns, "-o", "jsonpath={.receipts[0].segment}").stdout).To(Equal("1"))

		r = kubectlFence(adminCfg, "audit", "-n", ns, "-o", "wide")
		Expect(r.code).To(Equal(0), r.stderr)
		Expect(strings.Fields(strings.SplitN(r.stdout, "\n", 2)[0])).To(ContainElements("APIVERSION", "EXISTS"))
	})

	It("acts as the user --as and --as-group name, and honours --request-timeout, like kubectl", func() {
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		// The admin kubeconfig impersonating worker-b: the LockGrant webhook
		// only admits a grant whose owner is the requesting user.
		var g struct{ Name, Owner string }
		kubectlFence(adminCfg, "acquire", "batch", "-n", ns, "--request-id", "b1", "--as", "worker-b", "--as-group", workersGroup, "-o", "json").json(&g)
		Expect(g.Owner).To(Equal("worker-b"))
		Expect(getGrant(ns, g.Name).Spec.Owner).To(Equal("worker-b"))
		file := manifestFile("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: batch\ndata:\n  by: b\n")
		r := kubectlFence(adminCfg, "write", g.Name, "-f", file, "-n", ns, "--as", "worker-b", "--as-group", workersGroup)
		Expect(r.code).To(Equal(0), r.stderr)
		r = kubectlFence(adminCfg, "write", g.Name, "-f", file, "-n", ns, "--as", "worker-c", "--as-group", workersGroup)
		Expect(r.code).To(Equal(1))
		Expect(r.stderr).To(ContainSubstring(`belongs to "worker-b", not to "worker-c"`))

		// worker-b holds it; worker-a's acquire gives up after the request
		// timeout, not the 30 s --timeout default.
		start := time.Now()
		r = kubectlFence(a, "acquire", "batch", "-n", ns, "--request-id", "a1", "--request-timeout", "1s")
		Expect(r.code).To(Equal(1))
		Expect(r.stderr).To(ContainSubstring("not granted within 1s (--request-timeout)"))
		Expect(time.Since(start)).To(BeNumerically("<", 10*time.Second))
	})

	It("lists every namespace's FencedResources with status -A, with a NAMESPACE column", func() {
		other := newNamespace()
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		newTarget(protectedKinds[0], other, "batch", locksv1.EnforcementShadow)
		newTarget(protectedKinds[0], other, "archive", locksv1.EnforcementShadow)
		held(ns, "batch", "worker-a", "s1")

		// The table: other specs' namespaces may be listed too; ours are sorted.
		r := kubectlFence(a, "status", "-A")
		Expect(r.code).To(Equal(0), r.stderr)
		lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
		Expect(strings.Fields(lines[0])).To(Equal([]string{"NAMESPACE", "NAME", "TARGET", "ENFORCEMENT", "FENCE", "HOLDER", "EXPIRES", "QUEUE", "ATTENTION"}))
		rows := map[string][]string{}
		var order []string
		for _, line := range lines[1:] {
			if f := strings.Fields(line); f[0] == ns || f[0] == other {
				rows[f[0]+"/"+f[1]] = f
				order = append(order, f[0]+"/"+f[1])
			}
		}
		Expect(order).To(HaveLen(3))
		Expect(sort.StringsAreSorted(order)).To(BeTrue(), "rows in namespace, then name order: %v", order)
		Expect(rows[ns+"/batch"][:6]).To(Equal([]string{ns, "batch", "ConfigMap/batch", "Enforce", "1", "worker-a"}))
		Expect(rows[other+"/archive"]).To(Equal([]string{other, "archive", "ConfigMap/archive", "Shadow", "0", "-", "-", "0", "-"}))
		Expect(rows[other+"/batch"][:6]).To(Equal([]string{other, "batch", "ConfigMap/batch", "Shadow", "0", "-"}))

		// -o json: a list, each with its namespace; -o wide adds columns.
		var list []struct{ Namespace, Name string }
		kubectlFence(a, "status", "-A", "-o", "json").json(&list)
		var names []string
		for _, v := range list {
			if v.Namespace == ns || v.Namespace == other {
				names = append(names, v.Namespace+"/"+v.Name)
			}
		}
		Expect(names).To(ConsistOf(ns+"/batch", other+"/archive", other+"/batch"))
		r = kubectlFence(a, "status", "-A", "-o", "wide")
		Expect(r.code).To(Equal(0), r.stderr)
		Expect(strings.Fields(strings.SplitN(r.stdout, "\n", 2)[0])).To(ContainElements("NAMESPACE", "RESOURCEID", "HIGHEST-OBSERVED", "GRANT"))

		// Without -A the namespace's report is unchanged.
		r = kubectlFence(a, "status", "-n", other)
		Expect(r.code).To(Equal(0), r.stderr)
		Expect(r.stdout).To(HavePrefix("FencedResource archive ("))
		Expect(r.stdout).NotTo(ContainSubstring("NAMESPACE"))

		// A name across all namespaces is refused, as kubectl get refuses it.
		r = kubectlFence(a, "status", "batch", "-A")
		Expect(r.code).To(Equal(1))
		Expect(r.stderr).To(ContainSubstring("a FencedResource cannot be named across all namespaces: drop -A"))

		// A user who may read FencedResources of one namespace only is told what -A needs.
		reader := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fr-reader"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{locksv1.GroupVersion.Group}, Resources: []string{"fencedresources"}, Verbs: []string{"get", "list"}}}}
		Expect(admin.Create(suiteCtx, reader)).To(Succeed())
		Expect(admin.Create(suiteCtx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fr-reader"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "status-one-namespace"}},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "fr-reader"}})).To(Succeed())
		u, err := cp.AddUser("status-one-namespace")
		Expect(err).NotTo(HaveOccurred())
		oneNamespace := u.Config()
		Expect(kubectlFence(oneNamespace, "status", "-n", ns).code).To(Equal(0))
		r = kubectlFence(oneNamespace, "status", "-A")
		Expect(r.code).To(Equal(1))
		Expect(r.stderr).To(ContainSubstring("-A needs list on fencedresources.locks.fencekeeper.dev cluster-wide"))
	})

	It("prints the operator's version as its replicas report it, and unknown with the reason when it cannot tell", func() {
		// The suite's webhook replica is the operator's real VerifierReporter:
		// its Lease carries this build's version.
		build := version.Get()
		var lease coordinationv1.Lease
		Eventually(func(g Gomega) string {
			g.Expect(admin.Get(suiteCtx, client.ObjectKey{Namespace: opNamespace, Name: webhooks.VerifierLeaseName(webhooks.ReplicaName())}, &lease)).To(Succeed())
			return lease.Annotations[locksv1.AnnotationVersion]
		}).Should(Equal(build.Version))
		Expect(lease.Annotations).To(HaveKeyWithValue(locksv1.AnnotationCommit, build.Commit))

		var doc struct {
			ClientVersion   version.Info
			OperatorVersion struct {
				Version, Commit, Unknown string
				Replicas                 []struct {
					Replica, Version string
					Live             bool
				}
			}
		}
		kubectlFence(adminCfg, "version", "-o", "json").json(&doc)
		Expect(doc.ClientVersion.Version).To(Equal(build.Version))
		Expect(doc.OperatorVersion.Unknown).To(BeEmpty())
		Expect([]string{doc.OperatorVersion.Version, doc.OperatorVersion.Commit}).To(Equal([]string{build.Version, build.Commit}))
		Expect(doc.OperatorVersion.Replicas).To(ContainElement(
			And(HaveField("Replica", webhooks.ReplicaName()), HaveField("Version", build.Version), HaveField("Live", true))))
		r := kubectlFence(adminCfg, "version")
		Expect(r.code).To(Equal(0), r.stderr)
		Expect(r.stdout).To(ContainSubstring(fmt.Sprintf("\nOperator Version: %s (commit %s; ", build.Version, build.Commit)))

		// An operator elsewhere, its Leases written as the VerifierReporter
		// writes them: another build than this client's is told apart, and a
		// rollout lists each replica.
		report := func(replica, ver string) {
			GinkgoHelper()
			now := metav1.NewMicroTime(time.Now())
			Expect(admin.Create(suiteCtx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: webhooks.VerifierLeaseName(replica),
					Labels: map[string]string{"app.kubernetes.io/managed-by": "fencekeeper", locksv1.LabelComponent: locksv1.ComponentVerifier},
					Annotations: map[string]string{locksv1.AnnotationVerifierKeys: "k1", locksv1.AnnotationVerifierRevokedBelow: "0",
						locksv1.AnnotationVersion: ver, locksv1.AnnotationCommit: "c-" + ver}},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(replica), LeaseDurationSeconds: ptr.To(int32(60)), RenewTime: &now, AcquireTime: &now},
			})).To(Succeed())
		}
		r = kubectlFence(adminCfg, "version", "--operator-namespace", ns)
		Expect(r.code).To(Equal(0), r.stderr)
		Expect(r.stdout).To(ContainSubstring("Operator Version: unknown (no operator replica reports in namespace " + ns))
		report("manager-7d9f-a", "v0.4.1")
		r = kubectlFence(adminCfg, "version", "--operator-namespace", ns)
		Expect(r.stdout).To(ContainSubstring("Operator Version: v0.4.1 (commit c-v0.4.1; 1 live replica(s) in " + ns + ")"))
		report("manager-6c1a-b", "v0.4.0")
		r = kubectlFence(adminCfg, "version", "--operator-namespace", ns)
		Expect(r.code).To(Equal(0), r.stderr)
		Expect(r.stdout).To(ContainSubstring("Operator Version: unknown (the live replicas run 2 different builds (a rollout under way?))"))
		Expect(r.stdout).To(MatchRegexp(`manager-6c1a-b +true +v0\.4\.0 +c-v0\.4\.0`))
		Expect(r.stdout).To(MatchRegexp(`manager-7d9f-a +true +v0\.4\.1 +c-v0\.4\.1`))

		// A worker may not list the operator's Leases: unknown, and still exit 0.
		r = kubectlFence(a, "version")
		Expect(r.code).To(Equal(0), r.stderr)
		Expect(r.stdout).To(ContainSubstring("Operator Version: unknown (your user may not list Leases in " + opNamespace))
	})

	It("completes LockGrant and FencedResource names from the API server", func() {
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		newTarget(protectedKinds[0], ns, "other", locksv1.EnforcementEnforce)
		lg := held(ns, "batch", "worker-a", "c1")

		// __complete prints "name<TAB>description" lines, then ":directive"
		// (4: no file completion).
		names := func(r fencectlResult) []string {
			GinkgoHelper()
			Expect(r.code).To(Equal(0), r.stderr)
			var out []string
			for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
				name, _, _ := strings.Cut(line, "\t")
				out = append(out, name)
			}
			return out
		}
		Expect(names(kubectlFence(a, "__complete", "renew", "-n", ns, ""))).To(Equal([]string{lg.Name, ":4"}))
		r := kubectlFence(a, "__complete", "renew", "-n", ns, "")
		Expect(r.stdout).To(ContainSubstring(lg.Name + "\tbatch, Held by worker-a, fence 1"))
		Expect(names(kubectlFence(a, "__complete", "acquire", "-n", ns, "b"))).To(Equal([]string{"batch", ":4"}))
		Expect(names(kubectlFence(a, "__complete", "status", "-n", ns, ""))).To(Equal([]string{"batch", "other", ":4"}))
		// A second argument is not completed.
		r = kubectlFence(a, "__complete", "receipts", "batch", "-n", ns, "")
		Expect(r.stdout).NotTo(ContainSubstring("other"))

		r = kubectlFence(a, "completion", "bash")
		Expect(r.code).To(Equal(0), r.stderr)
		Expect(r.stdout).To(ContainSubstring("bash completion V2 for kubectl-fence"))
	})
})
