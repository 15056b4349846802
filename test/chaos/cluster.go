package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
)

// Host numbers of the topology in 10.77.<id>.0/24 (.1 is the host: the
// driver, nemesis and checker).
const (
	etcdHost     = 11 // .11-.13
	apiHost      = 21 // .21-.22
	operatorHost = 31 // .31-.32
	workerHost   = 41 // .41-.50
	// storeHost = 51: the PostgreSQL store (store.go)

	webhookPort = 9443 // each operator's, and each front end's on 127.0.0.1 of its API server's node
)

// widgets is the custom kind the workers protect besides ConfigMaps.
var widgets = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}

// Cluster is the replicated control plane: three etcd members, two
// kube-apiservers (each with the webhook front end on its node), two
// operator replicas (cmd/manager, leader election on), each process on its
// own node.
type Cluster struct {
	dir    string
	root   string
	net    *network
	pki    *pki
	bins   Binaries
	broken BrokenRules

	etcd, apis, fronts, ops []*proc
	kcm                     *proc    // kube-controller-manager, beside api-1; not a nemesis target
	store                   *pgStore // PostgreSQL, on its own node
	servers                 []string // https://<api ip>:6443
	skewFiles               []string // per operator
	admin                   *user
	adminCfg                []*rest.Config // per API server
	workerNodes             []*node
}

// Binaries the cluster runs: etcd, kube-apiserver and kube-controller-manager
// from bin/k8s, the manager built with -tags chaos, and this program (front end and workers).
type Binaries struct {
	Assets, Manager, Self string
}

// BrokenRules turn a safety rule off, to show the checker finds what it protects.
type BrokenRules struct {
	// CachedRegistryRead: the acceptance webhook reads the registry from its informer cache.
	CachedRegistryRead bool
	// UnprotectedStoreTable: the store's business tables are not put under
	// fencekeeper.protect, so a write without a segment lands.
	UnprotectedStoreTable bool
}

func (c *Cluster) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s chaos: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// startCluster builds the topology and waits until the operators issue.
func startCluster(ctx context.Context, root, dir string, netID, workers int, bins Binaries, broken BrokenRules) (c *Cluster, err error) {
	c = &Cluster{dir: dir, root: root, bins: bins, broken: broken}
	if c.net, err = newNetwork(netID); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if c.pki, err = newPKI(); err != nil {
		return nil, err
	}
	if err := c.addNodes(workers); err != nil {
		return nil, err
	}
	if err := c.startStore(ctx); err != nil {
		return nil, err
	}
	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	if err := c.startAPIServers(ctx); err != nil {
		return nil, err
	}
	if err := c.install(ctx); err != nil {
		return nil, err
	}
	if err := c.startControllerManager(ctx); err != nil {
		return nil, err
	}
	if err := c.startOperators(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// addNodes creates every node's namespace and address.
func (c *Cluster) addNodes(workers int) error {
	for i := 0; i < 3; i++ {
		if _, err := c.net.add(fmt.Sprintf("etcd-%d", i+1), etcdHost+i); err != nil {
			return err
		}
	}
	for i := 0; i < 2; i++ {
		nd, err := c.net.add(fmt.Sprintf("api-%d", i+1), apiHost+i)
		if err != nil {
			return err
		}
		c.servers = append(c.servers, "https://"+nd.ip+":6443")
	}
	for i := 0; i < 2; i++ {
		if _, err := c.net.add(fmt.Sprintf("operator-%d", i+1), operatorHost+i); err != nil {
			return err
		}
	}
	for i := 0; i < workers; i++ {
		nd, err := c.net.add(fmt.Sprintf("worker-%d", i+1), workerHost+i)
		if err != nil {
			return err
		}
		c.workerNodes = append(c.workerNodes, nd)
	}
	_, err := c.net.add("store", storeHost)
	return err
}

func (c *Cluster) node(name string) *node { return c.net.nodes[name] }

func (c *Cluster) startEtcd(ctx context.Context) error {
	var peers []string
	for i := 0; i < 3; i++ {
		peers = append(peers, fmt.Sprintf("etcd-%d=http://%s:2380", i+1, c.net.subnet(etcdHost+i)))
	}
	for i := 0; i < 3; i++ {
		name := fmt.Sprintf("etcd-%d", i+1)
		nd := c.node(name)
		p := &proc{name: name, node: nd, logPath: filepath.Join(c.dir, name+".log"), argv: []string{
			filepath.Join(c.bins.Assets, "etcd"), "--name=" + name, "--data-dir=" + filepath.Join(c.dir, name),
			"--listen-client-urls=http://" + nd.ip + ":2379", "--advertise-client-urls=http://" + nd.ip + ":2379",
			"--listen-peer-urls=http://" + nd.ip + ":2380", "--initial-advertise-peer-urls=http://" + nd.ip + ":2380",
			"--initial-cluster=" + strings.Join(peers, ","), "--initial-cluster-state=new", "--initial-cluster-token=fencekeeper-chaos",
			"--heartbeat-interval=100", "--election-timeout=1000", "--log-level=warn",
			// A process crash keeps the page cache: fsync only matters for a
			// machine crash, which the nemesis does not inject; it costs 2 cores dearly.
			"--unsafe-no-fsync",
		}}
		c.etcd = append(c.etcd, p)
		if err := p.start(); err != nil {
			return err
		}
	}
	for i := 0; i < 3; i++ {
		url := "http://" + c.net.subnet(etcdHost+i) + ":2379/health"
		if err := poll(ctx, 60*time.Second, "etcd member "+url, func() error { return httpOK(url) }); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) etcdServers() string {
	var s []string
	for i := 0; i < 3; i++ {
		s = append(s, "http://"+c.net.subnet(etcdHost+i)+":2379")
	}
	return strings.Join(s, ",")
}

func (c *Cluster) startAPIServers(ctx context.Context) error {
	saPub, saKey, err := serviceAccountKey(c.dir)
	if err != nil {
		return err
	}
	caFile := filepath.Join(c.dir, "ca.crt")
	if err := os.WriteFile(caFile, c.pki.caPEM, 0o600); err != nil {
		return err
	}
	if c.admin, err = c.pki.user(c.dir, "chaos-admin", []string{"system:masters"}, c.servers); err != nil {
		return err
	}
	for i := 0; i < 2; i++ {
		name := fmt.Sprintf("api-%d", i+1)
		nd := c.node(name)
		certPEM, keyPEM, err := c.pki.issue(name, nil, []string{nd.ip, "127.0.0.1", "10.0.0.1"})
		if err != nil {
			return err
		}
		dir := filepath.Join(c.dir, name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "tls.crt"), certPEM, 0o600); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "tls.key"), keyPEM, 0o600); err != nil {
			return err
		}
		p := &proc{name: name, node: nd, logPath: filepath.Join(c.dir, name+".log"), argv: []string{
			filepath.Join(c.bins.Assets, "kube-apiserver"), "--etcd-servers=" + c.etcdServers(),
			"--bind-address=" + nd.ip, "--advertise-address=" + nd.ip, "--secure-port=6443",
			"--tls-cert-file=" + filepath.Join(dir, "tls.crt"), "--tls-private-key-file=" + filepath.Join(dir, "tls.key"),
			"--client-ca-file=" + caFile, "--cert-dir=" + dir,
			"--service-account-key-file=" + saPub, "--service-account-signing-key-file=" + saKey,
			"--service-account-issuer=https://kubernetes.default.svc", "--service-cluster-ip-range=10.0.0.0/24",
			"--authorization-mode=RBAC", "--allow-privileged=true", "--disable-admission-plugins=ServiceAccount",
			"--enable-priority-and-fairness=false", "--profiling=false",
			// The checker reads every object's whole history from etcd.
			"--etcd-compaction-interval=0",
		}}
		c.apis = append(c.apis, p)
		c.adminCfg = append(c.adminCfg, c.pki.restConfig(c.admin, c.servers[i]))
		if err := p.start(); err != nil {
			return err
		}
	}
	return c.waitAPIServers(ctx)
}

// waitAPIServers waits until both API servers are ready.
func (c *Cluster) waitAPIServers(ctx context.Context) error {
	for i := range c.apis {
		cfg := c.adminCfg[i]
		if err := poll(ctx, 90*time.Second, "kube-apiserver "+c.servers[i], func() error { return readyz(ctx, cfg) }); err != nil {
			return err
		}
	}
	return nil
}

// install adds what an installation adds (CRDs, RBAC, webhook configuration
// pointing at each API server's front end), and the protected kind.
func (c *Cluster) install(ctx context.Context) error {
	cfg := c.adminCfg[0]
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{
		Paths:              []string{filepath.Join(c.root, "config", "crd", "bases"), filepath.Join(c.root, "test", "envtest", "testdata", "widgets.yaml")},
		ErrorIfPathMissing: true,
	}); err != nil {
		return fmt.Errorf("install CRDs: %w", err)
	}
	admin, err := client.New(cfg, client.Options{Scheme: locksv1.Scheme})
	if err != nil {
		return err
	}
	kinds := []schema.GroupVersionResource{widgets}
	if err := localcp.Install(ctx, admin, c.root, kinds); err != nil {
		return err
	}
	hooks, err := localcp.WebhookConfigurations(c.root, kinds)
	if err != nil {
		return err
	}
	return localcp.InstallWebhooks(ctx, admin, hooks, "127.0.0.1", webhookPort)
}

// startControllerManager runs kube-controller-manager's namespace and
// garbage-collector controllers (localcp's flags) on api-1's node against
// api-1, as the local control plane does, and waits until both started.
func (c *Cluster) startControllerManager(ctx context.Context) error {
	u, err := c.pki.user(c.dir, localcp.ControllerManagerUser, nil, c.servers)
	if err != nil {
		return err
	}
	c.kcm = &proc{name: "kube-controller-manager", node: c.node("api-1"), logPath: filepath.Join(c.dir, "kube-controller-manager.log"),
		argv: append([]string{filepath.Join(c.bins.Assets, localcp.ControllerManagerBinary)}, localcp.ControllerManagerArgs(u.kubeconfigs[0])...)}
	if err := c.kcm.start(); err != nil {
		return err
	}
	admin, err := c.adminClient(0)
	if err != nil {
		return err
	}
	return poll(ctx, 60*time.Second, "kube-controller-manager's controllers (service accounts "+strings.Join(localcp.ControllerServiceAccounts, ", ")+")", func() error {
		if !c.kcm.running() {
			return errors.New("kube-controller-manager exited: see " + c.kcm.logPath)
		}
		for _, sa := range localcp.ControllerServiceAccounts {
			if err := admin.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: sa}, &corev1.ServiceAccount{}); err != nil {
				return err
			}
		}
		return nil
	})
}

func (c *Cluster) startOperators(ctx context.Context) error {
	opUser, err := c.pki.user(c.dir, locksv1.OperatorUsername(locksv1.DefaultNamespace), nil, c.servers)
	if err != nil {
		return err
	}
	var backends []string
	for i := 0; i < 2; i++ {
		backends = append(backends, c.net.subnet(operatorHost+i)+":"+strconv.Itoa(webhookPort))
	}
	for i := 0; i < 2; i++ {
		name := fmt.Sprintf("front-%d", i+1)
		p := &proc{name: name, node: c.node(fmt.Sprintf("api-%d", i+1)), logPath: filepath.Join(c.dir, name+".log"), argv: []string{
			c.bins.Self, "front", "-listen=127.0.0.1:" + strconv.Itoa(webhookPort), "-backends=" + strings.Join(backends, ","),
		}}
		c.fronts = append(c.fronts, p)
		if err := p.start(); err != nil {
			return err
		}
	}
	for i := 0; i < 2; i++ {
		name := fmt.Sprintf("operator-%d", i+1)
		skew := filepath.Join(c.dir, name+".skew")
		if err := os.WriteFile(skew, []byte("0s"), 0o600); err != nil {
			return err
		}
		c.skewFiles = append(c.skewFiles, skew)
		argv := []string{c.bins.Manager, "--leader-elect", "--namespace=" + locksv1.DefaultNamespace,
			"--webhook-port=" + strconv.Itoa(webhookPort), "--self-signed-certs", "--webhook-hosts=127.0.0.1,localhost",
			"--metrics-bind-address=0", "--health-probe-bind-address=0", "--webhook-cert-sync-interval=5s",
			"--protected-kinds=widgets.example.com/v1", "--chaos-clock-skew-file=" + skew}
		if c.broken.CachedRegistryRead {
			argv = append(argv, "--chaos-cached-registry-read")
		}
		// Operator i talks to API server i.
		p := &proc{name: name, node: c.node(name), logPath: filepath.Join(c.dir, name+".log"), argv: argv,
			env: []string{"KUBECONFIG=" + opUser.kubeconfigs[i], "GOMEMLIMIT=256MiB"}}
		c.ops = append(c.ops, p)
		if err := p.start(); err != nil {
			return err
		}
	}
	admin, err := c.adminClient(0)
	if err != nil {
		return err
	}
	probe := &locksv1.FencedResource{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "webhook-warm-up"},
		Spec:       locksv1.FencedResourceSpec{ResourceID: "fencekeeper/webhook-warm-up", LeaseDurationSeconds: 1},
	}
	return poll(ctx, 120*time.Second, "the operators' webhooks through both API servers", func() error {
		for i := range c.apis {
			a, err := c.adminClient(i)
			if err != nil {
				return err
			}
			if err := a.Create(ctx, probe.DeepCopy(), client.DryRunAll); err != nil {
				return err
			}
		}
		var cm corev1.ConfigMap
		return admin.Get(ctx, client.ObjectKey{Namespace: locksv1.DefaultNamespace, Name: locksv1.IssuerEpochConfigMap}, &cm)
	})
}

func (c *Cluster) adminClient(i int) (client.WithWatch, error) {
	return client.NewWithWatch(c.adminCfg[i], client.Options{Scheme: locksv1.Scheme})
}

// Stop stops every process and removes the network.
func (c *Cluster) Stop() {
	for _, group := range [][]*proc{c.ops, c.fronts, {c.kcm}, c.apis, c.etcd} {
		for _, p := range group {
			if p != nil {
				p.stop(5 * time.Second)
			}
		}
	}
	if c.store != nil {
		_ = c.store.srv.Stop()
	}
	if c.net != nil {
		c.net.close()
	}
}

func poll(ctx context.Context, d time.Duration, what string, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %w", what, d, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func httpOK(url string) error {
	cl := http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

func readyz(ctx context.Context, cfg *rest.Config) error {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New("readyz: " + resp.Status)
	}
	return nil
}
