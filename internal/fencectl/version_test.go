package fencectl

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/version"
)

func TestVersionCommand(t *testing.T) {
	old, oldCommit := version.Version, version.Commit
	t.Cleanup(func() { version.Version, version.Commit = old, oldCommit })
	version.Version, version.Commit = "v1.2.3", "abc123"
	// A kubeconfig that names no cluster: the operator's version is unknown,
	// and the command still succeeds.
	empty := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	var out, errOut bytes.Buffer
	if code := Run(context.Background(), []string{"version", "--kubeconfig", empty}, &out, &errOut); code != 0 {
		t.Fatalf("kubectl fence version exited %d: %s", code, errOut.String())
	}
	lines := strings.Split(out.String(), "\n")
	if !strings.HasPrefix(lines[0], "Client Version: v1.2.3 (commit abc123, ") {
		t.Fatalf("text output %q", out.String())
	}
	if want := "Operator Version: unknown (no kubeconfig found: set KUBECONFIG or --kubeconfig)"; lines[1] != want {
		t.Fatalf("text output %q, want its second line %q", out.String(), want)
	}

	out.Reset()
	if code := Run(context.Background(), []string{"version", "-o", "json", "--client", "--kubeconfig", empty}, &out, &errOut); code != 0 {
		t.Fatalf("kubectl fence version -o json exited %d: %s", code, errOut.String())
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("json output %q: %v", out.String(), err)
	}
	var client version.Info
	if err := json.Unmarshal(got["clientVersion"], &client); err != nil || client.Version != "v1.2.3" || client.Commit != "abc123" {
		t.Fatalf("json output %s (%v)", out.String(), err)
	}
	if _, asked := got["operatorVersion"]; asked {
		t.Fatalf("--client printed the operator's version: %s", out.String())
	}
}

// verifierLease is a Lease as webhooks.VerifierReporter writes it.
func verifierLease(replica, ver, commit string, renewed time.Time) coordinationv1.Lease {
	l := coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: locksv1.VerifierLeasePrefix + replica, Namespace: locksv1.DefaultNamespace,
			Labels:      map[string]string{locksv1.LabelComponent: locksv1.ComponentVerifier},
			Annotations: map[string]string{locksv1.AnnotationVerifierKeys: "k1", locksv1.AnnotationVerifierRevokedBelow: "0"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(replica), LeaseDurationSeconds: ptr.To(int32(6)),
			RenewTime: &metav1.MicroTime{Time: renewed}},
	}
	if ver != "" {
		l.Annotations[locksv1.AnnotationVersion] = ver
		l.Annotations[locksv1.AnnotationCommit] = commit
	}
	return l
}

func TestOperatorVersionOf(t *testing.T) {
	now := time.Now()
	fresh, stale := now.Add(-time.Second), now.Add(-time.Minute)
	notVerifier := verifierLease("x", "v9", "c9", fresh)
	notVerifier.Name = locksv1.TargetClaimPrefix + "x"
	for _, tc := range []struct {
		name            string
		leases          []coordinationv1.Lease
		version, commit string
		unknown         string
		replicas        int
	}{
		{name: "no replica", leases: []coordinationv1.Lease{notVerifier}, unknown: "no operator replica reports in namespace fencekeeper-system"},
		{name: "one live", leases: []coordinationv1.Lease{verifierLease("a", "v0.3.0", "c1", fresh)}, version: "v0.3.0", commit: "c1", replicas: 1},
		{name: "two live agree, a stale one of an older build ignored", leases: []coordinationv1.Lease{
			verifierLease("a", "v0.3.0", "c1", fresh), verifierLease("b", "v0.3.0", "c1", fresh), verifierLease("old", "v0.2.0", "c0", stale),
		}, version: "v0.3.0", commit: "c1", replicas: 3},
		{name: "rollout", leases: []coordinationv1.Lease{verifierLease("a", "v0.3.0", "c1", fresh), verifierLease("b", "v0.2.0", "c0", fresh)},
			unknown: "the live replicas run 2 different builds", replicas: 2},
		{name: "same version, another commit", leases: []coordinationv1.Lease{verifierLease("a", "devel", "c1", fresh), verifierLease("b", "devel", "c2", fresh)},
			unknown: "the live replicas run 2 different builds", replicas: 2},
		{name: "none live", leases: []coordinationv1.Lease{verifierLease("a", "v0.3.0", "c1", stale)},
			unknown: "has reported in the last seconds", replicas: 1},
		{name: "a build that reports no version", leases: []coordinationv1.Lease{verifierLease("a", "", "", fresh)},
			unknown: "does not report its version", replicas: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := operatorVersionOf(tc.leases, locksv1.DefaultNamespace, now)
			if got.Version != tc.version || got.Commit != tc.commit || len(got.Replicas) != tc.replicas {
				t.Errorf("got %+v, want version %q commit %q and %d replicas", got, tc.version, tc.commit, tc.replicas)
			}
			if (tc.unknown == "") != (got.Unknown == "") || !strings.Contains(got.Unknown, tc.unknown) {
				t.Errorf("unknown = %q, want it to contain %q", got.Unknown, tc.unknown)
			}
		})
	}
}

// TestPrintVersion: a rollout lists every replica with its build.
func TestPrintVersion(t *testing.T) {
	now := time.Now()
	ov := operatorVersionOf([]coordinationv1.Lease{verifierLease("mgr-a", "v0.3.0", "c1", now), verifierLease("mgr-b", "v0.2.0", "c0", now)},
		"fencekeeper-system", now)
	var out bytes.Buffer
	o := &options{stdout: &out}
	o.printVersion(versionDoc{ClientVersion: version.Info{Version: "v0.3.0", Commit: "c1", GoVersion: "go", Platform: "p"}, OperatorVersion: &ov},
		"fencekeeper-system")
	text := out.String()
	for _, want := range []string{
		"Client Version: v0.3.0 (commit c1, go, p)\n",
		"Operator Version: unknown (the live replicas run 2 different builds (a rollout under way?))\n",
		"mgr-a    true  v0.3.0",
		"mgr-b    true  v0.2.0",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("printed\n%s\nwant it to contain %q", text, want)
		}
	}
}
