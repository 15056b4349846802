package ha

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/test/internal/front"
)

const workers = 4

// TestFailover runs two managers behind the round-robin front end, kills the
// leader with SIGKILL mid-traffic, then (after restarting it) the
// webhook-only replica, and checks that no protected write was wrongly
// accepted or lost and that fences continue under a new issuer epoch.
func TestFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	admin, err := cp.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	const ns = "ha"
	names := make([]string, workers)
	for i := range names {
		names[i] = fmt.Sprintf("res-%d", i)
	}
	createFencedResources(ctx, t, admin, ns, names)
	bin, err := buildManager(cp.Root(), workDir)
	if err != nil {
		t.Fatal(err)
	}
	kc := kubeconfig(t)
	a := &replica{name: "replica-a", port: freePort(t), bin: bin, kubecfg: kc, logPath: workDir + "/replica-a.log"}
	b := &replica{name: "replica-b", port: freePort(t), bin: bin, kubecfg: kc, logPath: workDir + "/replica-b.log"}
	defer a.stop()
	defer b.stop()
	defer func() {
		if t.Failed() {
			logTail(t, a.logPath)
			logTail(t, b.logPath)
		}
	}()
	fe, err := front.Listen("127.0.0.1:0", []string{a.addr(), b.addr()}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer fe.Close()
	if err := cp.InstallWebhooks(ctx, "127.0.0.1", fe.Port()); err != nil {
		t.Fatal(err)
	}
	if err := a.start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, a.leadingCh(), 60*time.Second, "replica-a to lead")
	if err := b.start(); err != nil {
		t.Fatal(err)
	}
	sameCertificate(ctx, t, a, b)
	if err := cp.WaitForWebhooks(ctx); err != nil {
		t.Fatal(err)
	}
	epochBefore := issuerEpoch(ctx, t)

	tr := newTraffic(ns)
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		user, err := cp.AddUser(fmt.Sprintf("system:serviceaccount:%s:worker-%d", ns, i), localcp.WorkersGroup)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func(i int, cfg *rest.Config) {
			defer wg.Done()
			if err := tr.worker(trafficCtx, i, cfg); err != nil {
				t.Errorf("worker %d: %v", i, err)
			}
		}(i, user.Config())
	}
	time.Sleep(8 * time.Second)

	// 1. The leader (issuer and webhook) dies without releasing its lease.
	killLeader := a.kill()
	waitFor(t, b.leadingCh(), 60*time.Second, "replica-b to take over")
	takeover := time.Now()
	time.Sleep(6 * time.Second)

	// 2. The first replica comes back (webhook only), then the webhook-only replica dies.
	if err := a.start(); err != nil {
		t.Fatal(err)
	}
	sameCertificate(ctx, t, a, b)
	time.Sleep(4 * time.Second)
	killWebhook := a.kill()
	time.Sleep(6 * time.Second)
	// A worker may have been mid-claim through both kills: let each get a
	// grant from the new leader before stopping (bounded).
	for deadline := time.Now().Add(40 * time.Second); !tr.allGrantedAfter(takeover, workers) && time.Now().Before(deadline); {
		time.Sleep(250 * time.Millisecond)
	}
	stopTraffic()
	wg.Wait()

	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, v := range tr.violations {
		t.Error(v)
	}
	if tr.stale[0] == 0 || tr.unfenced[0] == 0 {
		t.Errorf("no stale (%d) or unfenced (%d) write was tried: the traffic proves nothing", tr.stale[0], tr.unfenced[0])
	}
	checkFences(t, tr.fences, killLeader, takeover)
	checkAcked(ctx, t, tr, ns)
	if after := issuerEpoch(ctx, t); after <= epochBefore {
		t.Errorf("issuer epoch %d after the failover, want above %d", after, epochBefore)
	}
	tr.mu.Unlock()
	report(t, tr, "leader killed (SIGKILL)", killLeader)
	t.Logf("  new leader elected %v after the kill (lease expiry)", takeover.Sub(killLeader).Round(time.Millisecond))
	report(t, tr, "webhook-only replica killed (SIGKILL)", killWebhook)
	t.Logf("front end: %d connections skipped a dead backend; stale writes denied %d/%d, unfenced denied %d/%d (the rest: webhook unreachable, also refused)",
		fe.Skipped(), tr.stale[1], tr.stale[0], tr.unfenced[1], tr.unfenced[0])
	tr.mu.Lock()
}

func report(t *testing.T, tr *traffic, what string, k time.Time) {
	refused, gap, failed := tr.refusal(k)
	var firstGrant time.Duration = -1
	tr.mu.Lock()
	for _, fs := range tr.fences {
		for _, f := range fs {
			if f.at.After(k) && (firstGrant < 0 || f.at.Sub(k) < firstGrant) {
				firstGrant = f.at.Sub(k)
			}
		}
	}
	tr.mu.Unlock()
	t.Logf("%s: protected writes refused for %v (%d refused attempts); longest time without an accepted write in the 30s after %v; first new grant %v after the kill",
		what, refused.Round(time.Millisecond), failed, gap.Round(time.Millisecond), firstGrant.Round(time.Millisecond))
}

// checkFences: per resource, fences only grow, and the first grant the new
// leader issued is above every fence issued before the kill.
func checkFences(t *testing.T, fences map[string][]fenceAt, kill, takeover time.Time) {
	t.Helper()
	for res, fs := range fences {
		var before int64
		after := int64(-1)
		for i, f := range fs {
			if i > 0 && f.fence <= fs[i-1].fence {
				t.Errorf("%s: fence %d after %d", res, f.fence, fs[i-1].fence)
			}
			if f.at.Before(kill) && f.fence > before {
				before = f.fence
			}
			if f.at.After(takeover) && after < 0 {
				after = f.fence
			}
		}
		if after < 0 {
			t.Errorf("%s: no grant from the new leader", res)
		} else if after <= before {
			t.Errorf("%s: the new leader issued fence %d, not above %d issued before", res, after, before)
		}
	}
}

// checkAcked reads every object back: each acknowledged segment is there,
// no stale or unfenced key is.
func checkAcked(ctx context.Context, t *testing.T, tr *traffic, ns string) {
	t.Helper()
	admin, _ := cp.AdminClient()
	n := 0
	for res, keys := range tr.acked {
		var cm corev1.ConfigMap
		if err := admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: res}, &cm); err != nil {
			t.Fatal(err)
		}
		for k, v := range keys {
			n++
			if cm.Data[k] != v {
				t.Errorf("%s: acknowledged segment %s=%s lost (now %q)", res, k, v, cm.Data[k])
			}
		}
		for k := range cm.Data {
			if len(k) > 6 && (k[:6] == "stale-" || k[:6] == "unfenc") {
				t.Errorf("%s: refused write %s is in the object", res, k)
			}
		}
	}
	if n == 0 {
		t.Error("no segment was acknowledged")
	}
	t.Logf("%d acknowledged segments read back", n)
}

func issuerEpoch(ctx context.Context, t *testing.T) int64 {
	t.Helper()
	admin, _ := cp.AdminClient()
	var cm corev1.ConfigMap
	if err := admin.Get(ctx, types.NamespacedName{Namespace: locksv1.DefaultNamespace, Name: locksv1.IssuerEpochConfigMap}, &cm); err != nil {
		t.Fatal(err)
	}
	e, err := strconv.ParseInt(cm.Data[locksv1.IssuerEpochDataKey], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// sameCertificate: both replicas serve the Secret's one leaf.
func sameCertificate(ctx context.Context, t *testing.T, a, b *replica) {
	t.Helper()
	ca, err := a.servedCert(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := b.servedCert(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(ca) != string(cb) {
		t.Fatal("the replicas serve different certificates")
	}
}

func waitFor(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	port, err := localcp.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func logTail(t *testing.T, path string) {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 25 {
		lines = lines[len(lines)-25:]
	}
	t.Logf("%s (last lines):\n%s", path, strings.Join(lines, "\n"))
}
