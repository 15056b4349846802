package install

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/certs"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
)

// TestREADMEInstall follows the README's "Install in a cluster" block
// verbatim, one command per fresh `make dev BARE=1` cluster (the dev binary
// with -bare: etcd and kube-apiserver, nothing installed), then shows that
// the installation works: a FencedResource is enforced, a worker's grant is
// issued and its fenced write accepted, an unfenced write refused.
//
// The dev cluster has an API server and nothing else, so the test does what
// the rest of a cluster would do, and no more: it plays the kubelet (runs one
// replica of the installed Deployment's container, the manager binary, with
// its args, environment, service-account token and secret volume), the
// EndpointSlice controller (publishes that process's address for the webhook
// Service; the API server routes to it, --enable-aggregator-routing), and,
// for the command that needs cert-manager, cert-manager (issues the
// Certificate's Secret and injects its CA; its CRDs are the stand-ins of
// testdata/crds). Ports are the only arguments changed: the "pod" shares the
// host's network.
func TestREADMEInstall(t *testing.T) {
	ctrllog.SetLogger(logr.Discard()) // the clients here log nothing worth reading
	root := repoRoot(t)
	commands := readmeInstallCommands(t, root)
	if len(commands) != 2 || !strings.HasPrefix(commands[0], "kubectl apply") || !strings.HasPrefix(commands[1], "helm install") {
		t.Fatalf("the README's install block has changed (want kubectl apply, then helm install): %q", commands)
	}
	bin := t.TempDir()
	for name, pkg := range map[string]string{"fencekeeper-dev": "./cmd/dev", "manager": "./cmd/manager", "kubectl-fence": "./cmd/kubectl-fence"} {
		run(t, nil, "go", "build", "-C", root, "-o", filepath.Join(bin, name), pkg)
	}
	if err := os.Symlink(helm(t, root), filepath.Join(bin, "helm")); err != nil {
		t.Fatal(err)
	}
	for _, command := range commands {
		t.Run(strings.Fields(command)[0], func(t *testing.T) {
			c := startBareDev(t, root, bin)
			if strings.HasPrefix(command, "kubectl apply") {
				// The README's prerequisite for the manifest: cert-manager.
				shell(t, c, fmt.Sprintf("kubectl apply -f %s", filepath.Join(root, "test", "install", "testdata", "crds")))
			}
			shell(t, c, command)
			if strings.HasPrefix(command, "kubectl apply") {
				c.issueCertificates(t)
			}
			c.runManagerPod(t, bin)
			c.tour(t)
		})
	}
}

// readmeInstallCommands are the commands of the first sh block after the
// README's "## Install in a cluster", without comments.
func readmeInstallCommands(t *testing.T, root string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Install in a cluster\n")
	if !ok {
		t.Fatal(`README.md has no "## Install in a cluster" section`)
	}
	_, block, ok := strings.Cut(section, "```sh\n")
	if !ok {
		t.Fatal(`README.md: no sh block in "Install in a cluster"`)
	}
	block, _, _ = strings.Cut(block, "```")
	var out []string
	for _, line := range strings.Split(block, "\n") {
		line, _, _ = strings.Cut(line, "#")
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
		}
	}
	return out
}

// devCluster is one running `fencekeeper-dev -bare`.
type devCluster struct {
	root, dir string
	admin     client.Client
	kube      kubernetes.Interface
	env       []string // KUBECONFIG and PATH, as the dev command prints them
	// metricsPort is where the replica runManagerPod started serves metrics.
	metricsPort int
}

func startBareDev(t *testing.T, root, bin string) *devCluster {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(filepath.Join(bin, "fencekeeper-dev"), "-bare", "-dir", dir)
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			_ = err // stopped; its exit status after SIGTERM says nothing
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("fencekeeper-dev -bare did not stop on SIGTERM:\n%s", out.String())
		}
	})
	kubeconfig := filepath.Join(dir, "kubeconfig")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := os.Stat(kubeconfig); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("fencekeeper-dev -bare exited (%v):\n%s", err, out.String())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("fencekeeper-dev -bare wrote no kubeconfig in 2 minutes:\n%s", out.String())
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c := &devCluster{root: root, dir: dir,
		env: append(os.Environ(), "KUBECONFIG="+kubeconfig, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir())}
	if c.admin, err = client.New(cfg, client.Options{Scheme: locksv1.Scheme}); err != nil {
		t.Fatal(err)
	}
	if c.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return c
}

// shell runs one command line with the dev cluster's KUBECONFIG and PATH,
// from the repository root, as a reader of the README would.
func shell(t *testing.T, c *devCluster, line string) string {
	t.Helper()
	out, err := tryShell(c, line)
	if err != nil {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
	return out
}

func tryShell(c *devCluster, line string) (string, error) {
	cmd := exec.Command("sh", "-c", line)
	cmd.Dir, cmd.Env = c.root, c.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// issueCertificates does cert-manager's part: for each Certificate, a CA and
// a serving certificate for its dnsNames in its secretName, and the CA
// injected into webhook configurations that ask for it
// (cert-manager.io/inject-ca-from).
func (c *devCluster) issueCertificates(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(schema.GroupVersionKind{Group: "cert-manager.io", Version: "v1", Kind: "CertificateList"})
	if err := c.admin.List(ctx, list); err != nil || len(list.Items) == 0 {
		t.Fatalf("the installation has no cert-manager Certificate (%v)", err)
	}
	for _, cert := range list.Items {
		hosts, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
		secretName, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
		b, err := certs.Generate(hosts, 24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: cert.GetNamespace(), Name: secretName}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": b.Cert, "tls.key": b.Key, "ca.crt": b.CACert}}
		if err := c.admin.Create(ctx, secret); err != nil {
			t.Fatal(err)
		}
		var cfgs admissionregistrationv1.ValidatingWebhookConfigurationList
		if err := c.admin.List(ctx, &cfgs); err != nil {
			t.Fatal(err)
		}
		for i := range cfgs.Items {
			cfg := &cfgs.Items[i]
			if cfg.Annotations["cert-manager.io/inject-ca-from"] != cert.GetNamespace()+"/"+cert.GetName() {
				continue
			}
			for j := range cfg.Webhooks {
				cfg.Webhooks[j].ClientConfig.CABundle = b.CACert
			}
			if err := c.admin.Update(ctx, cfg); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// managerPod is what the kubelet would run for one replica of the installed
// manager Deployment: the container's args with its environment resolved,
// secret volumes in a directory of their own and the ports moved to free
// loopback ones (the "pod" shares the host's network).
type managerPod struct {
	namespace                           string
	args, env                           []string
	dir, readyPath                      string
	webhookPort, probePort, metricsPort int
}

func (c *devCluster) managerPod(t *testing.T) managerPod {
	t.Helper()
	var d appsv1.Deployment
	if err := c.admin.Get(context.Background(), client.ObjectKey{Namespace: locksv1.DefaultNamespace, Name: "fencekeeper-controller-manager"}, &d); err != nil {
		t.Fatalf("the installation has no manager Deployment: %v", err)
	}
	container := d.Spec.Template.Spec.Containers[0]
	// The image's entrypoint is the manager binary (Dockerfile); a command
	// would replace it.
	if len(container.Command) > 0 {
		t.Fatalf("the manager container sets a command this kubelet cannot run: %q", container.Command)
	}
	p := managerPod{namespace: d.Namespace, dir: t.TempDir(), readyPath: container.ReadinessProbe.HTTPGet.Path}
	env, vars := podEnv(t, &d, container)
	p.env = append(env, "KUBECONFIG="+c.serviceAccountKubeconfig(t, d.Namespace, d.Spec.Template.Spec.ServiceAccountName, p.dir))
	mounts := c.secretVolumes(t, &d, container, p.dir)
	for _, port := range []*int{&p.webhookPort, &p.probePort, &p.metricsPort} {
		var err error
		if *port, err = localcp.FreePort(); err != nil {
			t.Fatal(err)
		}
	}
	p.args = []string{fmt.Sprintf("--webhook-port=%d", p.webhookPort)}
	for _, a := range container.Args {
		a = envRef.ReplaceAllStringFunc(a, func(ref string) string { return vars[ref[2:len(ref)-1]] })
		for path, dir := range mounts {
			a = strings.ReplaceAll(a, path, dir)
		}
		a = strings.Replace(a, "--health-probe-bind-address=:8081", fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", p.probePort), 1)
		a = strings.Replace(a, "--metrics-bind-address=:8443", fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", p.metricsPort), 1)
		p.args = append(p.args, a)
	}
	return p
}

func (p managerPod) readyURL() string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", p.probePort, p.readyPath)
}

// runManagerPod does the kubelet's part for one replica of the installed
// manager Deployment, and the EndpointSlice controller's for the webhook
// Service, and waits until the replica is ready.
func (c *devCluster) runManagerPod(t *testing.T, bin string) {
	t.Helper()
	p := c.managerPod(t)
	c.metricsPort = p.metricsPort
	startProcess(t, filepath.Join(bin, "manager"), p.args, p.env, filepath.Join(p.dir, "manager.log"))
	c.publishEndpoint(t, p.namespace, p.webhookPort)
	waitReady(t, p.readyURL())
}

// envRef is a $(VAR) reference in a container argument.
var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// podEnv resolves the container's environment as the kubelet would (the
// downward API sources the manager uses) and returns it as KEY=value and
// as a map for $(VAR) references in args.
func podEnv(t *testing.T, d *appsv1.Deployment, container corev1.Container) ([]string, map[string]string) {
	t.Helper()
	var env []string
	vars := map[string]string{}
	for _, e := range container.Env {
		v := e.Value
		if from := e.ValueFrom; from != nil {
			switch {
			case from.FieldRef != nil && from.FieldRef.FieldPath == "metadata.namespace":
				v = d.Namespace
			case from.FieldRef != nil && from.FieldRef.FieldPath == "metadata.name":
				v = d.Name + "-pod"
			case from.ResourceFieldRef != nil && from.ResourceFieldRef.Resource == "limits.memory":
				v = strconv.FormatInt(container.Resources.Limits.Memory().Value(), 10)
			default:
				t.Fatalf("env %s: a source this kubelet does not know: %+v", e.Name, from)
			}
		}
		vars[e.Name] = v
		env = append(env, e.Name+"="+v)
	}
	return env, vars
}

// secretVolumes writes each secret volume the container mounts into a
// directory and returns mount path → directory.
func (c *devCluster) secretVolumes(t *testing.T, d *appsv1.Deployment, container corev1.Container, podDir string) map[string]string {
	t.Helper()
	mounts := map[string]string{}
	for _, m := range container.VolumeMounts {
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			var s corev1.Secret
			if err := c.admin.Get(context.Background(), client.ObjectKey{Namespace: d.Namespace, Name: v.Secret.SecretName}, &s); err != nil {
				t.Fatalf("volume %s: %v", v.Name, err)
			}
			dir := filepath.Join(podDir, "volumes", v.Name)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			for k, data := range s.Data {
				if err := os.WriteFile(filepath.Join(dir, k), data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			mounts[m.MountPath] = dir
		}
	}
	return mounts
}

// startProcess runs the container's process until the test ends, and shows
// the end of its log if the test failed.
func startProcess(t *testing.T, path string, args, env []string, logPath string) {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Env = env
	logs, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_, _ = cmd.Process.Wait()
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			t.Logf("%s %v:\n%s", filepath.Base(path), args, tail(data, 60))
		}
	})
}

// publishEndpoint does the EndpointSlice controller's part: the webhook
// Service's one endpoint is this host at port.
func (c *devCluster) publishEndpoint(t *testing.T, ns string, port int) {
	t.Helper()
	ctx := context.Background()
	var svc corev1.Service
	if err := c.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fencekeeper-webhook-service"}, &svc); err != nil {
		t.Fatal(err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: svc.Name + "-pod", Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{hostIP(t)}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(svc.Spec.Ports[0].Name), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if err := c.admin.Create(ctx, slice); err != nil {
		t.Fatal(err)
	}
}

// waitReady polls the readiness probe's URL until it answers 200.
func waitReady(t *testing.T, probe string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get(probe)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the manager replica is not ready after 90 s (%s: %v)", probe, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// serviceAccountKubeconfig is what the kubelet mounts for a pod of the
// service account, as a kubeconfig: a bound token and the API server's CA.
func (c *devCluster) serviceAccountKubeconfig(t *testing.T, ns, sa, dir string) string {
	t.Helper()
	tr, err := c.kube.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for service account %s/%s: %v", ns, sa, err)
	}
	admin, err := clientcmd.LoadFromFile(filepath.Join(c.dir, "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	cluster := admin.Clusters[admin.Contexts[admin.CurrentContext].Cluster]
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["dev"] = cluster
	cfg.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["sa"] = &clientcmdapi.Context{Cluster: "dev", AuthInfo: "sa"}
	cfg.CurrentContext = "sa"
	path := filepath.Join(dir, "serviceaccount.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// tour: the installation protects a ConfigMap end to end, as in the README's
// tour, with the dev cluster's worker kubeconfig bound as the README says.
func (c *devCluster) tour(t *testing.T) {
	t.Helper()
	worker := "KUBECONFIG=" + filepath.Join(c.dir, "worker-a.kubeconfig")
	for _, line := range []string{
		"kubectl create clusterrolebinding workers-request-locks --clusterrole=fencekeeper-lockgrant-requester --group=" + localcp.WorkersGroup,
		"kubectl create clusterrole configmap-writer --verb=get,list,watch,create,update,patch,delete --resource=configmaps",
		"kubectl create clusterrolebinding workers-write-configmaps --clusterrole=configmap-writer --group=" + localcp.WorkersGroup,
		"kubectl create namespace billing",
	} {
		shell(t, c, line)
	}
	// The webhooks answer as soon as the replica is ready, but the API server
	// learns the EndpointSlice through a watch: retry the first call briefly.
	var out string
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if out, err = tryShell(c, "kubectl apply -f config/samples/fencedresource.yaml"); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("kubectl apply -f config/samples/fencedresource.yaml: %v\n%s", err, out)
	}
	shell(t, c, `kubectl -n billing patch fr invoice-batch-2026-07-19 --type merge -p '{"spec":{"enforcement":"Enforce"}}'`)
	grant := strings.TrimSpace(shell(t, c, worker+" kubectl fence acquire invoice-batch-2026-07-19 -n billing -o name"))
	out = shell(t, c, worker+" kubectl fence write "+grant+" -n billing -f config/samples/invoice-batch-configmap.yaml")
	if !strings.Contains(out, "accepted: fence 1, segment 1") {
		t.Errorf("worker-a's fenced write: %s", out)
	}
	out, err = tryShell(c, "kubectl apply -f config/samples/invoice-batch-configmap.yaml")
	if err == nil || !strings.Contains(out, "FENCE_REQUIRED") {
		t.Errorf("an unfenced write of the protected ConfigMap was not refused with FENCE_REQUIRED (%v): %s", err, out)
	}
	c.handWrittenLockGrant(t, worker)
}

// handWrittenLockGrant: the sample LockGrant applies as it is, as the README
// says, queues behind worker-a's grant, and is issued when that one's lease
// runs out (nobody renews it here).
func (c *devCluster) handWrittenLockGrant(t *testing.T, worker string) {
	t.Helper()
	shell(t, c, worker+" kubectl apply -f config/samples/lockgrant.yaml")
	get := "kubectl -n billing get lg invoice-batch-2026-07-19-req-1 -o jsonpath={.status.phase}/{.status.grant.fenceToken}"
	var phase string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if phase = strings.TrimSpace(shell(t, c, get)); phase == "Held/2" {
			return
		}
	}
	t.Errorf("the sample LockGrant was not issued fence 2 within 60 s: phase/fence %q", phase)
}

// hostIP is this machine's first non-loopback IPv4 address: an EndpointSlice
// may not name a loopback address.
func hostIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	t.Fatal("this machine has no non-loopback IPv4 address for the webhook Service's EndpointSlice")
	return ""
}

func tail(data []byte, lines int) string {
	var all []string
	s := bufio.NewScanner(bytes.NewReader(data))
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		all = append(all, s.Text())
	}
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
