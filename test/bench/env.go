package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/internal/operator"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// rawGroup is the group of the baseline workers: they may write Leases.
const rawGroup = "bench:raw"

// env is the control plane, the operator and the clients every phase uses.
type env struct {
	cp     *localcp.ControlPlane
	admin  client.WithWatch
	adminC kubernetes.Interface
	op     operatorProcess
	log    io.Writer
	users  int
	mu     sync.Mutex
	// floor: the custom-resource floor's CRDs, RBAC and create webhook are
	// installed (floor.go).
	floor bool
	// stalls: release handoffs whose waiter was not seen queued within a
	// minute (waitQueued), with what the registry showed.
	stalls []string
	// runCtx lives as long as the run: what the env serves (the floor's
	// webhook) stops with it.
	runCtx context.Context
	// svc: with -failover, the operator's webhooks are reached through it,
	// as through a Service (failover.go).
	svc *webhookService
	// profiled: CPU profile windows written so far this run, by file
	// prefix (profile.go).
	profiled map[string]int
}

// operatorProcess is the operator under test: cmd/manager as a child process
// (the default: its RSS is its own) or the same code in this process.
type operatorProcess interface {
	// Memory reports the operator's memory now (RSS, and its Go heap from
	// its metrics: a scrape, which at 10,000 entries is no small load).
	Memory() (memSample, error)
	// Resident reads only the resident set, from /proc: cheap enough to
	// sample often (Heap stays 0).
	Resident() (memSample, error)
	// Metrics scrapes the operator's Prometheus metrics (text format).
	Metrics(ctx context.Context) (string, error)
	// HeapProfile is a pprof heap profile of the operator (what holds its memory).
	HeapProfile(ctx context.Context) ([]byte, error)
	// CPUProfile is a pprof CPU profile of the operator over the next d;
	// errOperatorInProcess when the operator shares the bench's own profile.
	CPUProfile(ctx context.Context, d time.Duration) ([]byte, error)
	Stop() error
	Describe() string
}

type memSample struct {
	// RSS and HWM (peak RSS) in bytes, from /proc/<pid>/status; Anon and
	// File split RSS into anonymous memory (what the process allocated) and
	// mapped file pages (its binary's code and data as far as they were
	// touched: bounded by the binary's size, reclaimable by the kernel).
	// Heap is the Go heap in use.
	RSS, HWM, Anon, File, Heap uint64
	Source                     string
}

// startEnv starts etcd, kube-apiserver and the operator.
func startEnv(ctx context.Context, cfg *config, log io.Writer) (*env, error) {
	cp, err := localcp.Start(ctx, localcp.Options{})
	if err != nil {
		return nil, err
	}
	e := &env{cp: cp, log: log, runCtx: ctx}
	ok := false
	defer func() {
		if !ok {
			e.stop()
		}
	}()
	if e.admin, err = cp.AdminClient(); err != nil {
		return nil, err
	}
	admin := rest.CopyConfig(cp.Admin)
	admin.QPS, admin.Burst = -1, 0
	if e.adminC, err = kubernetes.NewForConfig(admin); err != nil {
		return nil, err
	}
	// The baseline workers write Leases in the bench namespaces, nothing else.
	for _, obj := range []client.Object{
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "bench-lease-writer"}, Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "bench-lease-writer"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "bench-lease-writer"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: rawGroup}}},
	} {
		if err := e.admin.Create(ctx, obj); err != nil {
			return nil, err
		}
	}
	if cfg.inProcess {
		e.op, err = startInProcess(ctx, cp, cfg)
	} else {
		if cfg.failover {
			if e.svc, err = newWebhookService(ctx); err != nil {
				return nil, err
			}
		}
		e.op, err = startSubprocess(ctx, cp, cfg, e.svc)
	}
	if err != nil {
		return nil, err
	}
	if err := e.waitIssuing(ctx); err != nil {
		return nil, err
	}
	ok = true
	return e, nil
}

func (e *env) stop() {
	if e.op != nil {
		if err := e.op.Stop(); err != nil {
			fmt.Fprintf(e.log, "operator stop: %v\n", err)
		}
	}
	if err := e.cp.Stop(); err != nil {
		fmt.Fprintf(e.log, "control plane stop: %v\n", err)
		// Never leave our own etcd or kube-apiserver behind: kill the
		// children of this process by PID (nobody else's).
		for pid, comm := range children() {
			if comm == "etcd" || comm == "kube-apiserver" {
				if p, err := os.FindProcess(pid); err == nil {
					_ = p.Kill()
					fmt.Fprintf(e.log, "killed %s (pid %d)\n", comm, pid)
				}
			}
		}
	}
}

// dumpMetrics writes the operator's and the API server's metrics into dir.
func (e *env) dumpMetrics(ctx context.Context, dir string) {
	if text, err := e.op.Metrics(ctx); err == nil {
		_ = os.WriteFile(filepath.Join(dir, "operator-metrics.txt"), []byte(text), 0o644)
	}
	if raw, err := e.adminC.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx); err == nil {
		_ = os.WriteFile(filepath.Join(dir, "apiserver-metrics.txt"), raw, 0o644)
	}
}

// namespace creates a namespace for one phase.
func (e *env) namespace(ctx context.Context, name string) error {
	return e.admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
}

// user adds an authenticated user and returns its REST config (each user has
// its own client certificate, so its own connection to the API server).
func (e *env) user(prefix string, groups ...string) (*rest.Config, string, error) {
	e.mu.Lock()
	e.users++
	name := fmt.Sprintf("%s-%d", prefix, e.users)
	e.mu.Unlock()
	u, err := e.cp.AddUser(name, groups...)
	if err != nil {
		return nil, "", err
	}
	cfg := rest.CopyConfig(u.Config())
	cfg.QPS, cfg.Burst = -1, 0 // no client-side throttling: we measure the server
	return cfg, name, nil
}

// worker is a lockclient worker with its own identity.
func (e *env) worker(ctx context.Context, ns string) (*lockclient.Client, client.WithWatch, error) {
	cfg, _, err := e.user("worker", localcp.WorkersGroup)
	if err != nil {
		return nil, nil, err
	}
	kube, err := client.NewWithWatch(cfg, client.Options{Scheme: locksv1.Scheme})
	if err != nil {
		return nil, nil, err
	}
	c, err := lockclient.NewForConfig(ctx, cfg, ns)
	return c, kube, err
}

// rawWorker is a baseline worker: a typed clientset allowed to write Leases.
func (e *env) rawWorker() (kubernetes.Interface, string, error) {
	cfg, name, err := e.user("raw", rawGroup)
	if err != nil {
		return nil, "", err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	return cs, name, err
}

// fencedResource creates a FencedResource (Enforce) with the given lease and
// optional ConfigMap target.
func (e *env) fencedResource(ctx context.Context, ns, name string, lease int32, target string) error {
	fr := &locksv1.FencedResource{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: locksv1.FencedResourceSpec{ResourceID: ns + "/" + name, LeaseDurationSeconds: lease,
			Enforcement: locksv1.EnforcementEnforce},
	}
	if target != "" {
		fr.Spec.Target = &locksv1.ObjectTarget{APIVersion: "v1", Kind: "ConfigMap", Name: target}
	}
	return e.admin.Create(ctx, fr)
}

// waitIssuing returns once the operator's webhooks answer and it issues a grant.
func (e *env) waitIssuing(ctx context.Context) error {
	const ns = "bench-ready"
	if err := e.namespace(ctx, ns); err != nil {
		return err
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		err := e.fencedResource(ctx, ns, "ready", 60, "")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the API server cannot reach the operator's webhooks: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	c, _, err := e.worker(ctx, ns)
	if err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, time.Until(deadline))
	defer cancel()
	l, err := c.Acquire(actx, "ready", lockclient.AcquireOptions{})
	if err != nil {
		return fmt.Errorf("the operator issues no grant: %w", err)
	}
	return l.Release(actx)
}

// --- the operator as a child process (cmd/manager) -------------------------

type subprocess struct {
	cmd         *exec.Cmd
	metricsAddr string
	pprofAddr   string
	certDir     string
	done        chan error
	logFile     *os.File
}

func startSubprocess(ctx context.Context, cp *localcp.ControlPlane, cfg *config, svc *webhookService) (*subprocess, error) {
	bin := filepath.Join(cfg.workDir(cp.Root()), "manager")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return nil, err
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/manager")
	build.Dir = cp.Root()
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./cmd/manager: %v\n%s", err, out)
	}
	// The ports are picked free and then handed to the child, so another
	// process (go test runs packages side by side) can take one in between:
	// the operator then exits at once. Start it again on other ports.
	for attempt := 1; ; attempt++ {
		s, err := launchOperator(ctx, cp, cfg, svc, bin, "manager.log")
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			return s, err
		}
		fmt.Fprintf(os.Stderr, "bench: %v; starting the operator again on other ports\n", err)
	}
}

// freePort picks a free loopback port (a variable so a test can hand out a taken one).
var freePort = localcp.FreePort

// errPortTaken is an operator that exited because a port it was given was
// taken before it could bind it.
var errPortTaken = errors.New("a port picked for the operator was taken")

// launchOperator starts cmd/manager (built at bin) on fresh ports, logging
// to logName in the work directory, installs the webhook configurations
// pointing at it, or at svc with it as svc's newest replica (replacing an
// earlier launch's), and returns once its webhooks answer and its readiness
// probe passes.
func launchOperator(ctx context.Context, cp *localcp.ControlPlane, cfg *config, svc *webhookService, bin, logName string) (*subprocess, error) {
	var ports [4]int
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	webhookPort, metricsPort, probePort, pprofPort := ports[0], ports[1], ports[2], ports[3]
	hookPort := webhookPort
	if svc != nil {
		svc.add(fmt.Sprintf("127.0.0.1:%d", webhookPort))
		hookPort = svc.port()
	}
	if err := cp.InstallWebhooks(ctx, "127.0.0.1", hookPort); err != nil {
		return nil, err
	}
	// The operator's own identity, bound to exactly the generated RBAC.
	u, err := cp.AddUser(locksv1.OperatorUsername(locksv1.DefaultNamespace))
	if err != nil {
		return nil, err
	}
	kubeconfig, err := u.KubeConfig()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "fencekeeper-bench-operator-")
	if err != nil {
		return nil, err
	}
	kcPath := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kcPath, kubeconfig, 0o600); err != nil {
		return nil, err
	}
	logPath := filepath.Join(cfg.workDir(cp.Root()), logName)
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	s := &subprocess{metricsAddr: fmt.Sprintf("127.0.0.1:%d", metricsPort), pprofAddr: fmt.Sprintf("127.0.0.1:%d", pprofPort), certDir: dir, done: make(chan error, 1), logFile: logFile}
	probeAddr := fmt.Sprintf("127.0.0.1:%d", probePort)
	s.cmd = exec.Command(bin,
		"--self-signed-certs", "--webhook-hosts=127.0.0.1,localhost",
		"--webhook-port="+strconv.Itoa(webhookPort), "--webhook-cert-dir="+filepath.Join(dir, "certs"),
		// The harness scrapes its own operator on loopback: plain HTTP.
		"--metrics-bind-address="+s.metricsAddr, "--metrics-secure=false", "--health-probe-bind-address="+probeAddr,
		"--pprof-bind-address="+s.pprofAddr,
		"--webhook-configuration="+locksv1.WebhookConfigurationName,
		fmt.Sprintf("--max-concurrent-reconciles=%d", cfg.maxReconciles),
		fmt.Sprintf("--memory-limit=%d", cfg.operatorMemLimit))
	s.cmd.Env = append(os.Environ(), "KUBECONFIG="+kcPath)
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { s.done <- s.cmd.Wait() }()
	// Stop waiting for the webhooks as soon as the operator exits.
	wctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case err := <-s.done:
			s.done <- err
			cancel()
		case <-wctx.Done():
		}
	}()
	err = cp.WaitForWebhooks(wctx)
	if err == nil {
		err = s.waitReady(wctx, probeAddr)
	}
	cancel()
	if err != nil {
		_ = s.Stop()
		if log, _ := os.ReadFile(logPath); bytes.Contains(log, []byte("address already in use")) {
			return nil, fmt.Errorf("%w: %v", errPortTaken, err)
		}
		return nil, fmt.Errorf("%w (operator log: %s)", err, logPath)
	}
	return s, nil
}

// waitReady waits until the operator's readiness probe passes and its own
// metrics are served on the metrics port, or for ctx (which launchOperator
// cancels when the operator exits). The metrics check matters: the webhook
// server can be ready a moment before a taken metrics port stops the
// operator, and another process on that port answers, if at all, without
// fencekeeper's metrics.
func (s *subprocess) waitReady(ctx context.Context, probeAddr string) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		if s.answers(ctx, "http://"+probeAddr+"/readyz", "") && s.answers(ctx, "http://"+s.metricsAddr+"/metrics", "fencekeeper_build_info") {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("the operator exited while starting, or the bench was stopped: %w", ctx.Err())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the operator's readiness probe on %s or its metrics on %s did not answer within 60 s", probeAddr, s.metricsAddr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// answers reports whether url answers 200 within a second, with want in its body.
func (s *subprocess) answers(ctx context.Context, url, want string) bool {
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	body, err := httpGet(rctx, url)
	return err == nil && strings.Contains(body, want)
}

func (s *subprocess) Describe() string {
	return fmt.Sprintf("cmd/manager as a child process (pid %d), RSS from /proc/<pid>/status", s.cmd.Process.Pid)
}

func (s *subprocess) Memory() (memSample, error) {
	m, err := procMemory(s.cmd.Process.Pid)
	if err != nil {
		return m, err
	}
	if text, err := s.Metrics(context.Background()); err == nil {
		if v, ok := parseMetrics(text)["go_memstats_heap_inuse_bytes"]; ok {
			m.Heap = uint64(v)
		}
	}
	m.Source = "/proc/<pid>/status of cmd/manager; heap from its go_memstats_heap_inuse_bytes"
	return m, nil
}

func (s *subprocess) Resident() (memSample, error) {
	return procMemory(s.cmd.Process.Pid)
}

func (s *subprocess) Metrics(ctx context.Context) (string, error) {
	return httpGet(ctx, "http://"+s.metricsAddr+"/metrics")
}

func (s *subprocess) HeapProfile(ctx context.Context) ([]byte, error) {
	p, err := httpGet(ctx, "http://"+s.pprofAddr+"/debug/pprof/heap?gc=1")
	return []byte(p), err
}

func (s *subprocess) CPUProfile(ctx context.Context, d time.Duration) ([]byte, error) {
	p, err := httpGet(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", s.pprofAddr, int(d.Seconds())))
	return []byte(p), err
}

func (s *subprocess) Stop() error {
	select {
	case err := <-s.done:
		s.done <- err
	default:
		_ = s.cmd.Process.Signal(os.Interrupt)
		select {
		case <-s.done: //nolint:errcheck // the exit status of an interrupted process says nothing
		case <-time.After(15 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done //nolint:errcheck // nor that of a killed one
		}
	}
	_ = s.logFile.Close()
	return os.RemoveAll(s.certDir)
}

// --- the operator in this process (for profiling with -cpuprofile) ----------

type inProcess struct {
	op          *localcp.Operator
	metricsAddr string
}

func startInProcess(ctx context.Context, cp *localcp.ControlPlane, cfg *config) (*inProcess, error) {
	port, err := localcp.FreePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	op, err := cp.RunOperator(ctx, operator.Options{MaxConcurrentReconciles: cfg.maxReconciles, MetricsAddr: addr, MetricsInsecure: true})
	if err != nil {
		return nil, err
	}
	return &inProcess{op: op, metricsAddr: addr}, nil
}

func (p *inProcess) HeapProfile(context.Context) ([]byte, error) {
	runtime.GC()
	var b bytes.Buffer
	err := pprof.Lookup("heap").WriteTo(&b, 0)
	return b.Bytes(), err
}

// errOperatorInProcess: an in-process operator's CPU is in the bench's own
// profile (-in-process), told apart by package.
var errOperatorInProcess = errors.New("the operator runs in this process: its CPU is in the bench's profile")

func (p *inProcess) CPUProfile(context.Context, time.Duration) ([]byte, error) {
	return nil, errOperatorInProcess
}

func (p *inProcess) Describe() string {
	return "in this process (internal/localcp.RunOperator); memory is the whole bench process's"
}

func (p *inProcess) Memory() (memSample, error) {
	m, err := procMemory(os.Getpid())
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.Heap = ms.HeapInuse
	m.Source = "/proc/self/status of the bench process (operator in-process: includes the bench's own clients)"
	return m, err
}

func (p *inProcess) Resident() (memSample, error) {
	return procMemory(os.Getpid())
}

func (p *inProcess) Metrics(ctx context.Context) (string, error) {
	return httpGet(ctx, "http://"+p.metricsAddr+"/metrics")
}

func (p *inProcess) Stop() error { return p.op.Stop() }

// --- helpers -----------------------------------------------------------------

func procMemory(pid int) (memSample, error) {
	var m memSample
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseUint(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			m.RSS = kb << 10
		case "VmHWM:":
			m.HWM = kb << 10
		case "RssAnon:":
			m.Anon = kb << 10
		case "RssFile:":
			m.File = kb << 10
		}
	}
	return m, sc.Err()
}

// childRSS reports the RSS of this process's children by command name
// (kube-apiserver, etcd, manager).
func childRSS() map[string]uint64 {
	out := map[string]uint64{}
	for pid, comm := range children() {
		if m, err := procMemory(pid); err == nil {
			out[comm] += m.RSS
		}
	}
	return out
}

// children maps the PIDs of this process's children to their command names.
func children() map[int]string {
	out := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		comm, fields, err := procStat(pid)
		if err != nil || len(fields) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid != self {
			continue
		}
		out[pid] = comm
	}
	return out
}

func httpGet(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}

// parseMetrics reads the Prometheus text format into series → value; the key
// is the series as printed (name{labels}).
func parseMetrics(text string) map[string]float64 {
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out
}

// apiRequests counts the requests the API server served, by
// resource[/subresource] and verb ("leases PUT"), from its
// apiserver_request_total metric; isWrite tells the mutating verbs.
func (e *env) apiRequests(ctx context.Context) (map[string]float64, error) {
	raw, err := e.adminC.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for series, v := range parseMetrics(string(raw)) {
		if !strings.HasPrefix(series, "apiserver_request_total{") {
			continue
		}
		labels := parseLabels(series)
		if labels["dry_run"] != "" || labels["resource"] == "" {
			continue
		}
		key := labels["resource"]
		if labels["subresource"] != "" {
			key += "/" + labels["subresource"]
		}
		out[key+" "+labels["verb"]] += v
	}
	return out, nil
}

// isWrite reports whether a key of apiRequests counts a mutating request.
func isWrite(key string) bool {
	_, verb, _ := strings.Cut(key, " ")
	switch verb {
	case "POST", "PUT", "PATCH", "DELETE", "APPLY", "CREATE", "UPDATE":
		return true
	}
	return false
}

func parseLabels(series string) map[string]string {
	out := map[string]string{}
	open, closing := strings.IndexByte(series, '{'), strings.LastIndexByte(series, '}')
	if open < 0 || closing < open {
		return out
	}
	body := series[open+1 : closing]
	for len(body) > 0 {
		eq := strings.IndexByte(body, '=')
		if eq < 0 || eq+1 >= len(body) || body[eq+1] != '"' {
			break
		}
		key := strings.TrimLeft(body[:eq], ",")
		var val bytes.Buffer
		i := eq + 2
		for ; i < len(body); i++ {
			if body[i] == '\\' && i+1 < len(body) {
				i++
				val.WriteByte(body[i])
				continue
			}
			if body[i] == '"' {
				break
			}
			val.WriteByte(body[i])
		}
		out[key] = val.String()
		body = body[min(i+1, len(body)):]
	}
	return out
}

func diffCounts(after, before map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// --- LockGrant phases, followed by one watch ---------------------------------

// phases follows the LockGrants of one namespace through a single watch so a
// phase can wait for "this LockGrant reached Pending" without polling.
type phases struct {
	mu      sync.Mutex
	phase   map[string]locksv1.LockGrantPhase
	at      map[string]map[locksv1.LockGrantPhase]time.Time // when this watch saw each phase
	waiters map[string][]phaseWaiter
	held    atomic.Int64
	// fenceAt: when this watch saw a FencedResource's status.fenceToken reach a value.
	fenceAt map[string]map[int64]time.Time
}

type phaseWaiter struct {
	want []locksv1.LockGrantPhase
	ch   chan locksv1.LockGrantPhase
}

func (e *env) followPhases(ctx context.Context, ns string) (*phases, error) {
	p := &phases{phase: map[string]locksv1.LockGrantPhase{}, waiters: map[string][]phaseWaiter{},
		at: map[string]map[locksv1.LockGrantPhase]time.Time{}, fenceAt: map[string]map[int64]time.Time{}}
	// relist: a watch that ended with an error (410 Gone: its
	// resourceVersion was compacted while it reconnected) starts again
	// from a fresh list, or it would retry the compacted version forever.
	relist := func() (string, error) {
		var list locksv1.LockGrantList
		if err := e.admin.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return "", err
		}
		for i := range list.Items {
			p.set(list.Items[i].Name, list.Items[i].Status.Phase)
		}
		return list.ResourceVersion, nil
	}
	rv, err := relist()
	if err != nil {
		return nil, err
	}
	go func() {
		for ctx.Err() == nil {
			if rv == "" {
				if rv, _ = relist(); rv == "" {
					time.Sleep(100 * time.Millisecond)
					continue
				}
			}
			w, err := e.admin.Watch(ctx, &locksv1.LockGrantList{}, client.InNamespace(ns),
				&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					rv = ""
					break
				}
				lg, ok := ev.Object.(*locksv1.LockGrant)
				if !ok {
					continue
				}
				rv = lg.ResourceVersion
				if ev.Type == watch.Bookmark {
					continue
				}
				if ev.Type == watch.Deleted {
					p.set(lg.Name, "")
					continue
				}
				p.set(lg.Name, lg.Status.Phase)
			}
			w.Stop()
		}
	}()
	return p, nil
}

func (p *phases) set(name string, ph locksv1.LockGrantPhase) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setLocked(name, ph)
}

func (p *phases) setLocked(name string, ph locksv1.LockGrantPhase) {
	old := p.phase[name]
	if old == ph {
		return
	}
	if old == locksv1.PhaseHeld {
		p.held.Add(-1)
	}
	if ph == locksv1.PhaseHeld {
		p.held.Add(1)
	}
	p.phase[name] = ph
	if p.at[name] == nil {
		p.at[name] = map[locksv1.LockGrantPhase]time.Time{}
	}
	if _, seen := p.at[name][ph]; !seen {
		p.at[name][ph] = time.Now()
	}
	keep := p.waiters[name][:0]
	for _, w := range p.waiters[name] {
		if contains(w.want, ph) {
			w.ch <- ph
			continue
		}
		keep = append(keep, w)
	}
	p.waiters[name] = keep
}

// queued records that the registry queued LockGrant name: it is Pending
// for the bench even before the issuer mirrors that (it writes a new
// Pending phase 100 ms late).
func (p *phases) queued(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.phase[name] == "" {
		p.setLocked(name, locksv1.PhasePending)
	}
}

// seen returns when this watch first saw LockGrant name in phase ph.
func (p *phases) seen(name string, ph locksv1.LockGrantPhase) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.at[name][ph]
}

// fenceSeen returns when this watch saw FencedResource name's fenceToken reach f.
func (p *phases) fenceSeen(name string, f int64) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fenceAt[name][f]
}

// followFences adds a watch of the namespace's FencedResources, recording
// when each status.fenceToken value (the issuer's CAS) became visible.
func (e *env) followFences(ctx context.Context, ns string, p *phases) error {
	seen := func(fr *locksv1.FencedResource) {
		for _, q := range fr.Status.Queue {
			p.queued(q.GrantName)
		}
		now := time.Now()
		p.mu.Lock()
		if p.fenceAt[fr.Name] == nil {
			p.fenceAt[fr.Name] = map[int64]time.Time{}
		}
		if _, ok := p.fenceAt[fr.Name][fr.Status.FenceToken]; !ok {
			p.fenceAt[fr.Name][fr.Status.FenceToken] = now
		}
		p.mu.Unlock()
	}
	// relist: as in followPhases, a watch that ended with an error starts
	// again from a fresh list.
	relist := func() (string, error) {
		var list locksv1.FencedResourceList
		if err := e.admin.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return "", err
		}
		for i := range list.Items {
			seen(&list.Items[i])
		}
		return list.ResourceVersion, nil
	}
	rv, err := relist()
	if err != nil {
		return err
	}
	go func() {
		for ctx.Err() == nil {
			if rv == "" {
				if rv, _ = relist(); rv == "" {
					time.Sleep(100 * time.Millisecond)
					continue
				}
			}
			w, err := e.admin.Watch(ctx, &locksv1.FencedResourceList{}, client.InNamespace(ns),
				&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					rv = ""
					break
				}
				fr, ok := ev.Object.(*locksv1.FencedResource)
				if !ok {
					continue
				}
				rv = fr.ResourceVersion
				if ev.Type == watch.Bookmark {
					continue
				}
				seen(fr)
			}
			w.Stop()
		}
	}()
	return nil
}

// wait blocks until the LockGrant name is in one of the phases.
func (p *phases) wait(ctx context.Context, name string, want ...locksv1.LockGrantPhase) (locksv1.LockGrantPhase, error) {
	p.mu.Lock()
	if ph := p.phase[name]; contains(want, ph) {
		p.mu.Unlock()
		return ph, nil
	}
	ch := make(chan locksv1.LockGrantPhase, 1)
	p.waiters[name] = append(p.waiters[name], phaseWaiter{want: want, ch: ch})
	p.mu.Unlock()
	select {
	case ph := <-ch:
		return ph, nil
	case <-ctx.Done():
		return "", fmt.Errorf("LockGrant %s did not reach %v: %w", name, want, ctx.Err())
	}
}

func contains(want []locksv1.LockGrantPhase, ph locksv1.LockGrantPhase) bool {
	for _, w := range want {
		if w == ph {
			return true
		}
	}
	return false
}
