// Package fencectl_test runs the kubectl fence commands that talk to a
// PostgreSQL fenced store (pg install, pg status, receipts --resource) as
// the binary runs them (fencectl.Run) against a real PostgreSQL from the
// machine's server binaries: one server for the package, started by the
// first test that needs it, a database per test.
package fencectl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekeeper/fencekeeper/internal/fencectl"
	"github.com/fencekeeper/fencekeeper/internal/pgserver"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

var (
	pgOnce   sync.Once
	pg       *pgserver.Server
	pgErr    error
	pgRoles  = []string{"fk_operator", "fk_worker", "fk_app", "fk_creator"}
	dbSerial int
)

func TestMain(m *testing.M) {
	code := m.Run()
	if pg != nil {
		_ = pg.Stop()
	}
	os.Exit(code)
}

// newDB is a fresh database of the package's server (TCP on 127.0.0.1 too,
// where passwords count), and the roles the tests log in as.
func newDB(t *testing.T) string {
	t.Helper()
	pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if pg, pgErr = pgserver.Start(ctx, pgserver.Options{ListenAddress: "127.0.0.1:0", Fast: true}); pgErr != nil {
			return
		}
		for _, r := range pgRoles {
			if pgErr = pg.Exec(ctx, "postgres", fmt.Sprintf("CREATE ROLE %s LOGIN", r)); pgErr != nil {
				return
			}
		}
	})
	if pgErr != nil {
		t.Fatalf("starting PostgreSQL: %v", pgErr)
	}
	dbSerial++
	name := fmt.Sprintf("fence_%d_%d", os.Getpid(), dbSerial)
	if err := pg.CreateDatabase(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	return name
}

// as is the unix-socket DSN of db for role ("" the superuser).
func as(db, role string) string {
	if role == "" {
		return pg.DSN(db)
	}
	return pg.DSN(db) + " user=" + role
}

// fenceRun runs kubectl fence with args and returns its exit code, stdout and stderr.
func fenceRun(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := fencectl.Run(ctx, args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// mustRun runs kubectl fence and fails the test unless it exits 0.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errOut := fenceRun(t, args...)
	if code != 0 {
		t.Fatalf("kubectl fence %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// mustFail runs kubectl fence, wants exit 1, and returns stderr.
func mustFail(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errOut := fenceRun(t, args...)
	if code != 1 {
		t.Fatalf("kubectl fence %s: exit %d, want 1\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errOut)
	}
	return errOut
}

func contains(t *testing.T, what, text string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("%s:\n%s\nwant it to contain %q", what, text, w)
		}
	}
}

func decode[T any](t *testing.T, out string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("-o json printed what does not parse: %v\n%s", err, out)
	}
	return v
}

type installDoc struct {
	Database        string   `json:"database"`
	VersionBefore   int      `json:"versionBefore"`
	Version         int      `json:"version"`
	Changed         bool     `json:"changed"`
	OperatorRole    string   `json:"operatorRole"`
	WorkerRoles     []string `json:"workerRoles"`
	BreakGlassRoles []string `json:"breakGlassRoles"`
}

type statusDoc struct {
	Installed         bool   `json:"installed"`
	SchemaVersion     int    `json:"schemaVersion"`
	Install           string `json:"install"`
	RevokedBelowEpoch int64  `json:"revokedBelowEpoch"`
	Resources         []struct {
		Resource     string `json:"resource"`
		Mode         string `json:"mode"`
		Generation   int64  `json:"generation"`
		HighestFence int64  `json:"highestFence"`
		LastSegment  int64  `json:"lastSegment"`
		Holder       *struct {
			Owner     string    `json:"owner"`
			Fence     int64     `json:"fence"`
			ExpiresAt time.Time `json:"expiresAt"`
			Expired   bool      `json:"expired"`
		} `json:"holder"`
		Receipts       int64 `json:"receipts"`
		ShadowRefusals *struct {
			Last24h int64 `json:"last24h"`
			Total   int64 `json:"total"`
		} `json:"shadowRefusals"`
		BreakGlass *struct {
			Last24h int64 `json:"last24h"`
		} `json:"breakGlassAudit"`
	} `json:"resources"`
}

type receiptsDoc struct {
	Resource     string `json:"resource"`
	HighestFence int64  `json:"highestFence"`
	LastSegment  int64  `json:"lastSegment"`
	Receipts     []struct {
		Fence       int64     `json:"fence"`
		Segment     int64     `json:"segment"`
		Operation   string    `json:"operation"`
		Payload     string    `json:"payload"`
		Receipt     string    `json:"receipt"`
		CommittedAt time.Time `json:"committedAt"`
	} `json:"receipts"`
}

// TestPGInstallAndStatus: status before install says how to install;
// install on an empty database goes 0 → SchemaVersion; again, it is a no-op;
// status after it, as the operator's role, shows the schema and no resource.
func TestPGInstallAndStatus(t *testing.T) {
	db := newDB(t)
	t.Setenv("FENCEKEEPER_PG_DSN", as(db, "")) // the superuser, from the environment

	out := mustRun(t, "pg", "status")
	contains(t, "pg status before install", out, "fencekeeper schema: not installed in database \""+db+"\"", "kubectl fence pg install --dsn DSN")
	before := decode[statusDoc](t, mustRun(t, "pg", "status", "-o", "json"))
	if before.Installed || before.SchemaVersion != 0 || !strings.Contains(before.Install, "pg install") || len(before.Resources) != 0 {
		t.Errorf("pg status -o json before install = %+v", before)
	}

	out = mustRun(t, "pg", "install", "--operator-role", "fk_operator", "--worker-role", "fk_worker")
	contains(t, "pg install", out, fmt.Sprintf("fencekeeper schema: version 0 → %d\n", pgfence.SchemaVersion), "operator role: fk_operator", "worker roles: fk_worker")

	again := decode[installDoc](t, mustRun(t, "pg", "install", "--operator-role", "fk_operator", "--worker-role", "fk_worker", "-o", "json"))
	if again.Changed || again.VersionBefore != pgfence.SchemaVersion || again.Version != pgfence.SchemaVersion || again.OperatorRole != "fk_operator" ||
		strings.Join(again.WorkerRoles, ",") != "fk_worker" || again.BreakGlassRoles == nil || again.Database != db {
		t.Errorf("pg install again -o json = %+v, want a no-op at version %d", again, pgfence.SchemaVersion)
	}
	out = mustRun(t, "pg", "install", "--operator-role", "fk_operator")
	contains(t, "pg install again", out, fmt.Sprintf("version %d → %d (already installed", pgfence.SchemaVersion, pgfence.SchemaVersion))

	// --dsn wins over the environment; the operator's role reads the store.
	out = mustRun(t, "pg", "status", "--dsn", as(db, "fk_operator"))
	contains(t, "pg status as the operator", out, fmt.Sprintf("fencekeeper schema: version %d in database %q", pgfence.SchemaVersion, db),
		`(as role "fk_operator")`, "revoked below epoch: 0", "No resource is published")
	after := decode[statusDoc](t, mustRun(t, "pg", "status", "--dsn", as(db, "fk_operator"), "-o", "json"))
	if !after.Installed || after.SchemaVersion != pgfence.SchemaVersion || after.Resources == nil || len(after.Resources) != 0 {
		t.Errorf("pg status -o json after install = %+v", after)
	}
	if got := mustRun(t, "pg", "status", "--dsn", as(db, "fk_operator"), "-o", "jsonpath={.schemaVersion}"); got != fmt.Sprint(pgfence.SchemaVersion) {
		t.Errorf("pg status -o jsonpath={.schemaVersion} = %q", got)
	}
}

// TestPGReceiptsAfterASegment: the operator publishes a resource and a
// signed grant, a worker commits a segment through pgfence.BeginSegment;
// pg status shows the holder and the receipt, receipts --resource shows it.
func TestPGReceiptsAfterASegment(t *testing.T) {
	db := newDB(t)
	ctx := context.Background()
	mustRun(t, "pg", "install", "--dsn", as(db, ""), "--operator-role", "fk_operator", "--worker-role", "fk_worker")
	const resource = "billing/invoice-batch"
	env := publishAndCommit(t, db, resource)
	operator := as(db, "fk_operator")

	checkCommitted(t, decode[statusDoc](t, mustRun(t, "pg", "status", "--dsn", operator, "-o", "json")), resource)
	out := mustRun(t, "pg", "status", "--dsn", operator, "--resource", resource)
	contains(t, "pg status --resource", out, "RESOURCE", "HOLDER", resource, "worker-a (fence 5)", "Enforce")
	contains(t, "pg status --resource unknown", mustFail(t, "pg", "status", "--dsn", operator, "--resource", "billing/nope"), `no resource "billing/nope" is published`)

	var want string
	conn := connect(t, as(db, ""))
	if err := conn.QueryRow(ctx, "SELECT receipt FROM fencekeeper.receipts").Scan(&want); err != nil {
		t.Fatal(err)
	}
	got := decode[receiptsDoc](t, mustRun(t, "receipts", "--dsn", operator, "--resource", resource, "-o", "json"))
	if got.Resource != resource || got.HighestFence != 5 || got.LastSegment != 1 || len(got.Receipts) != 1 {
		t.Fatalf("receipts --resource -o json = %+v", got)
	}
	if rc := got.Receipts[0]; rc.Fence != 5 || rc.Segment != 1 || rc.Operation != env.Operation || rc.Payload != env.Payload || rc.Receipt != want ||
		time.Since(rc.CommittedAt) > 5*time.Minute {
		t.Errorf("receipt = %+v, want fence 5 segment 1 of %s, receipt %s", rc, env.Operation, want)
	}
	out = mustRun(t, "receipts", "--dsn", operator, "--resource", resource)
	contains(t, "receipts --resource", out, "highest fence 5, last segment 1", "COMMITTED", want)

	// A worker reads its operation's receipts (find_receipts), not the whole table.
	t.Setenv("FENCEKEEPER_PG_DSN", as(db, "fk_worker"))
	mine := decode[receiptsDoc](t, mustRun(t, "receipts", "--resource", resource, "--operation", env.Operation, "-o", "json"))
	if len(mine.Receipts) != 1 || mine.Receipts[0].Receipt != want {
		t.Errorf("receipts --operation as the worker = %+v", mine)
	}
	none := decode[receiptsDoc](t, mustRun(t, "receipts", "--resource", resource, "--operation", "another", "-o", "json"))
	if none.Receipts == nil || len(none.Receipts) != 0 {
		t.Errorf("receipts of another operation = %+v, want an empty list", none)
	}
	contains(t, "receipts as the worker without --operation", mustFail(t, "receipts", "--resource", resource),
		`role "fk_worker" may not read the receipts of `+resource, "permission denied", "with --operation")
	contains(t, "pg status as the worker", mustFail(t, "pg", "status"), `role "fk_worker" may not`, "operator's role")
}

// checkCommitted: pg status shows resource with publishAndCommit's grant
// as its holder and its one receipt.
func checkCommitted(t *testing.T, st statusDoc, resource string) {
	t.Helper()
	if len(st.Resources) != 1 {
		t.Fatalf("pg status -o json: resources = %+v, want %s", st.Resources, resource)
	}
	r := st.Resources[0]
	if r.Resource != resource || r.Mode != "Enforce" || r.Generation != 1 || r.HighestFence != 5 || r.LastSegment != 1 || r.Receipts != 1 {
		t.Errorf("pg status -o json resource = %+v", r)
	}
	if h := r.Holder; h == nil || h.Owner != "worker-a" || h.Fence != 5 || h.Expired || time.Until(h.ExpiresAt) < 30*time.Minute {
		t.Errorf("pg status -o json holder = %+v, want worker-a's grant of fence 5, expiring in an hour", h)
	}
	if r.ShadowRefusals == nil || r.ShadowRefusals.Total != 0 || r.BreakGlass == nil || r.BreakGlass.Last24h != 0 {
		t.Errorf("pg status -o json audit counts = %+v, %+v; want zeros", r.ShadowRefusals, r.BreakGlass)
	}
}

// publishAndCommit publishes resource and a grant of fence 5 for worker-a
// as the operator's role, and commits segment 1 as the worker's role.
func publishAndCommit(t *testing.T, db, resource string) fence.Envelope {
	t.Helper()
	ctx := context.Background()
	signer, err := grant.NewSigner("issuer", bytes.Repeat([]byte{1}, 32))
	if err != nil {
		t.Fatal(err)
	}
	g := grant.Grant{Schema: grant.Schema, Resource: resource, Owner: "worker-a", RequestID: "req-a", Lease: "lease-a",
		OperationRoot: "sha256:" + strings.Repeat("a", 64), FenceToken: 5, BackendRevision: "7", PolicyGeneration: 1,
		IssuerEpoch: 1, TTLSeconds: 3600, IssuedAt: time.Now().UTC().Format(time.RFC3339)}
	operator := connect(t, as(db, "fk_operator"))
	must(t, pgfence.PublishResource(ctx, operator, resource, pgfence.Enforce, 1))
	must(t, pgfence.PublishGrant(ctx, operator, g, time.Now().Add(time.Hour)))
	_, proof, err := signer.Sign(g)
	must(t, err)
	payload, err := fence.PayloadDigest(map[string]any{"amount": "42"})
	must(t, err)
	env := fence.Envelope{Grant: g, Proof: proof, Operation: "nightly-42", Segment: 1, Payload: payload}
	worker := connect(t, as(db, "fk_worker"))
	must(t, pgx.BeginFunc(ctx, worker, func(tx pgx.Tx) error {
		_, err := pgfence.BeginSegment(ctx, tx, env)
		return err
	}))
	return env
}

// TestPGRefusals: what the commands refuse, and that they say why: an
// unreachable server and a wrong password (the host named, the password
// never printed), a role that may not install, a role that does not exist.
func TestPGRefusals(t *testing.T) {
	db := newDB(t)
	const secret = "s3cret-Pw_x"

	errOut := mustFail(t, "pg", "status", "--dsn", "postgres://fk_app:"+secret+"@127.0.0.1:1/"+db+"?connect_timeout=5")
	contains(t, "pg status, nothing listening", errOut, `cannot connect to database "`+db+`" at 127.0.0.1:1 as role "fk_app"`)
	errOut += mustFail(t, "pg", "install", "--dsn", pg.TCPDSN(db)+" user=fk_app password='"+secret+"'")
	contains(t, "pg install, wrong password", errOut, "at "+pg.TCPAddress(), `as role "fk_app"`, "password authentication failed")
	errOut += mustFail(t, "receipts", "--dsn", "host=127.0.0.1 port=1 password="+secret+" connect_timeout=5", "--resource", "x")
	errOut += mustFail(t, "pg", "status", "--dsn", "postgres://fk_app:"+secret+"@[::1:bad/"+db)
	if strings.Contains(errOut, secret) {
		t.Errorf("an error printed the password:\n%s", errOut)
	}
	contains(t, "a DSN that does not parse", errOut, "bad --dsn", "xxxxx")

	t.Setenv("FENCEKEEPER_PG_DSN", "")
	contains(t, "no DSN", mustFail(t, "pg", "status"), "give --dsn DSN or set FENCEKEEPER_PG_DSN")

	contains(t, "pg install as a role without CREATE", mustFail(t, "pg", "install", "--dsn", as(db, "fk_app")),
		`role "fk_app" may not install`, `lacks CREATE on database "`+db+`"`, "GRANT CREATE ON DATABASE")
	contains(t, "pg install naming a missing role", mustFail(t, "pg", "install", "--dsn", as(db, ""), "--operator-role", "fk_operator", "--worker-role", "fk_nobody"),
		`no such role`, `"fk_nobody" (--worker-role)`)
	contains(t, "receipts before install", mustFail(t, "receipts", "--dsn", as(db, "fk_operator"), "--resource", "x"), "not installed", "pg install")

	mustRun(t, "pg", "install", "--dsn", as(db, ""), "--operator-role", "fk_operator")
	if err := pg.Exec(context.Background(), db, "GRANT CREATE ON DATABASE "+db+" TO fk_creator"); err != nil {
		t.Fatal(err)
	}
	contains(t, "pg install as a role that does not own the schema", mustFail(t, "pg", "install", "--dsn", as(db, "fk_creator")),
		`role "fk_creator" may not install`, `owned by "postgres"`)
	contains(t, "pg status as a role that may not read", mustFail(t, "pg", "status", "--dsn", as(db, "fk_app")), `role "fk_app" may not`, "operator's role")
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
