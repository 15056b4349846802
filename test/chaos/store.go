package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekeeper/fencekeeper/internal/pgserver"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// The PostgreSQL store: one server in its own network namespace, the
// fencekeeper schema installed once, and per schedule one protected
// business table per resource, which every FencedResource names as its
// store (spec.stores, through a Secret holding the operator role's DSN).
const (
	storeHost     = 51 // 10.77.<id>.51
	storePort     = 5432
	storeDB       = "chaos"
	storeOperator = "chaos_operator" // publishes (pgfence.InstallOptions.OperatorRole)
	storeWorker   = "chaos_worker"   // commits segments (WorkerRoles)
	storeSecret   = "chaos-store"    // the Secret (and store name) in each schedule's namespace
)

// pgStore is the store's server and the passwords of its two login roles.
type pgStore struct {
	srv  *pgserver.Server
	node *node

	mu   sync.Mutex
	down bool // killed by the nemesis, not restarted yet

	operatorPassword, workerPassword string
}

// startStore starts PostgreSQL in the store node's namespace (fsync on: a
// SIGKILL is a real crash and a real recovery), lets the topology's subnet
// in with passwords, and installs the schema with its two roles.
func (c *Cluster) startStore(ctx context.Context) error {
	nd := c.node("store")
	srv, err := pgserver.Start(ctx, pgserver.Options{
		NetNS: filepath.Join("/run/netns", nd.ns), ListenAddress: nd.ip + ":" + strconv.Itoa(storePort),
		Settings: map[string]string{
			// A worker cut off mid-transaction holds its resource's row lock
			// until the server notices the peer is gone: probe idle
			// connections after 5 s, drop them after 3 lost probes 2 s apart.
			"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3",
		},
	})
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	s := &pgStore{srv: srv, node: nd, operatorPassword: secret(), workerPassword: secret()}
	c.store = s
	hba := fmt.Sprintf("\nhost all all %s/24 scram-sha-256\n", c.net.subnet(0))
	f, err := os.OpenFile(filepath.Join(srv.DataDir(), "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(hba)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := srv.CreateDatabase(ctx, storeDB); err != nil {
		return err
	}
	if err := srv.Exec(ctx, storeDB, fmt.Sprintf("SELECT pg_reload_conf(); CREATE ROLE %s LOGIN PASSWORD '%s'; CREATE ROLE %s LOGIN PASSWORD '%s'",
		storeOperator, s.operatorPassword, storeWorker, s.workerPassword)); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, srv.DSN(storeDB))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	return pgfence.Install(ctx, conn, pgfence.InstallOptions{OperatorRole: storeOperator, WorkerRoles: []string{storeWorker}})
}

func secret() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// tcpDSN is role's DSN over the network: what crosses the bridge, and what
// the nemesis cuts.
func (s *pgStore) tcpDSN(role, password string) string {
	return fmt.Sprintf("host=%s port=%d dbname=%s user=%s password=%s sslmode=disable connect_timeout=3", s.node.ip, storePort, storeDB, role, password)
}

// kill crashes the server (SIGKILL to the postmaster); restart recovers it.
func (s *pgStore) kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = true
	return s.srv.Kill()
}

func (s *pgStore) restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.down {
		return nil
	}
	if err := s.srv.Restart(ctx); err != nil {
		return fmt.Errorf("store restart: %w\n%s", err, s.srv.LogTail(20))
	}
	s.down = false
	return nil
}

// storeTable is the business table of a resource in a schedule's namespace.
func storeTable(ns, res string) string {
	return "ledger_" + strings.NewReplacer("-", "_", "/", "_").Replace(ns+"_"+res)
}

// createStoreTables makes each resource's business table: an append-only
// ledger whose seq is the commit order (every writer takes the resource's
// advisory lock before it inserts, and holds it to the end of its
// transaction), xact the writing transaction, protected under the
// resource's ID unless the broken rule leaves it unprotected.
func (c *Cluster) createStoreTables(ctx context.Context, ns string) error {
	for _, r := range resources {
		t := pgx.Identifier{storeTable(ns, r)}.Sanitize()
		sql := fmt.Sprintf(`CREATE TABLE %[1]s (
    seq       bigserial PRIMARY KEY,
    resource  text NOT NULL,
    fence     bigint NOT NULL,
    request   text NOT NULL,
    operation text NOT NULL,
    segment   bigint NOT NULL,
    payload   text NOT NULL,
    worker    text NOT NULL,
    xact      xid8 NOT NULL DEFAULT pg_current_xact_id(),
    at        timestamptz NOT NULL DEFAULT clock_timestamp()
);
GRANT SELECT, INSERT ON %[1]s TO %[2]s;
GRANT USAGE ON SEQUENCE %[3]s TO %[2]s;`, t, storeWorker, pgx.Identifier{storeTable(ns, r) + "_seq_seq"}.Sanitize())
		if !c.broken.UnprotectedStoreTable {
			sql += fmt.Sprintf("\nSELECT fencekeeper.protect('%s', '%s');", t, ns+"/"+r)
		}
		if err := c.store.srv.Exec(ctx, storeDB, sql); err != nil {
			return err
		}
	}
	return nil
}

// storeRow is one business row as the checker reads it.
type storeRow struct {
	seq                     int64
	fence, segment          int64
	req, op, payload, owner string
	xact                    string
	at                      time.Time
}

// storeReceipt is one row of fencekeeper.receipts.
type storeReceipt struct {
	fence, segment       int64
	op, payload, receipt string
	xact                 string
	committedAt          time.Time
}

// storeState is what the checker reads from the store after a schedule,
// per resource name: the business rows in commit order, the receipts kept,
// and the resource's highest accepted fence.
type storeState struct {
	rows     map[string][]storeRow
	receipts map[string][]storeReceipt
	highest  map[string]int64
}

// readStore reads the store's tables with SQL as the superuser, over the
// unix socket (never through fencekeeper's functions or packages).
func (c *Cluster) readStore(ctx context.Context, ns string) (*storeState, error) {
	st := &storeState{rows: map[string][]storeRow{}, receipts: map[string][]storeReceipt{}, highest: map[string]int64{}}
	if err := c.store.restart(ctx); err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, c.store.srv.DSN(storeDB))
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	for _, r := range resources {
		rows, err := conn.Query(ctx, fmt.Sprintf("SELECT seq, fence, segment, request, operation, payload, worker, xact::text, at FROM %s ORDER BY seq",
			pgx.Identifier{storeTable(ns, r)}.Sanitize()))
		if err != nil {
			return nil, err
		}
		st.rows[r], err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (storeRow, error) {
			var x storeRow
			err := row.Scan(&x.seq, &x.fence, &x.segment, &x.req, &x.op, &x.payload, &x.owner, &x.xact, &x.at)
			return x, err
		})
		if err != nil {
			return nil, err
		}
		rows, err = conn.Query(ctx, "SELECT fence, segment, operation, payload, receipt, xact_id::text, committed_at FROM fencekeeper.receipts WHERE resource_id = $1 ORDER BY fence, segment", ns+"/"+r)
		if err != nil {
			return nil, err
		}
		st.receipts[r], err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (storeReceipt, error) {
			var x storeReceipt
			err := row.Scan(&x.fence, &x.segment, &x.op, &x.payload, &x.receipt, &x.xact, &x.committedAt)
			return x, err
		})
		if err != nil {
			return nil, err
		}
		var h int64
		if err := conn.QueryRow(ctx, "SELECT coalesce((SELECT highest_fence FROM fencekeeper.resources WHERE resource_id = $1), 0)", ns+"/"+r).Scan(&h); err != nil {
			return nil, err
		}
		st.highest[r] = h
	}
	return st, nil
}

// checkStore judges the store like the objects, from its own rows: in commit
// order no segment under a fence below one already accepted for the
// resource, each fence's segments contiguous from 1 under one grant, every
// row's grant one the registry issued; every commit a worker saw
// acknowledged is there and none it saw refused; what it could not decide
// was escalated on its LockGrant; no adversary write got in; and the
// receipts the store keeps agree with the rows, transaction by transaction.
func (r *scheduleResult) checkStore(st *storeState, issued map[string]map[int64]string, events []Event, escalated map[string]bool) {
	landed := map[string]bool{} // res/req/segment/payload
	for res, rows := range st.rows {
		state, highest := registerValue{Absent: true}, int64(0)
		for _, x := range rows {
			r.counts["store rows"]++
			w := registerValue{Fence: x.fence, Req: x.req, Segment: x.segment}
			landed[fmt.Sprintf("%s/%s/%d/%s", res, x.req, x.segment, x.payload)] = true
			if issued[res][x.fence] != x.req {
				r.violate(vStoreUnissued, "%s seq %d: fence %d of %s; the registry issued it to %q", res, x.seq, x.fence, x.req, issued[res][x.fence])
			}
			if x.fence < highest {
				// Judged once: the rows after it follow the accepted ones.
				r.violate(vStoreStale, "%s seq %d: fence %d segment %d (%s, %s) committed after fence %d was accepted", res, x.seq, x.fence, x.segment, x.req, x.owner, highest)
				continue
			}
			if !follows(state, w) {
				r.violate(vStoreOrder, "%s seq %d: fence %d segment %d (%s) after fence %d segment %d (%s)", res, x.seq, x.fence, x.segment, x.req, state.Fence, state.Segment, state.Req)
			}
			state, highest = w, x.fence
		}
		r.checkReceipts(res, rows, st.receipts[res], st.highest[res], highest)
	}
	for _, e := range events {
		in := landed[fmt.Sprintf("%s/%s/%d/%s", e.Resource, e.RequestID, e.Segment, e.Payload)]
		switch e.Kind {
		case "store":
			r.counts["store commits "+e.Outcome]++
			switch {
			case e.Outcome == "ok" && !in:
				r.violate(vStoreLost, "%s: acknowledged segment %d of %s (fence %d) is not in the store", e.Resource, e.Segment, e.RequestID, e.Fence)
			case (e.Outcome == "rejected" || e.Outcome == "denied") && in:
				r.violate(vStoreRefusedLanded, "%s: segment %d of %s was reported %s and is in the store (%s)", e.Resource, e.Segment, e.RequestID, e.Outcome, e.Detail)
			case e.Outcome == "unknown" && !escalated[e.RequestID]:
				r.violate(vStoreUnknown, "%s: segment %d of %s unknown and not recorded on its LockGrant", e.Resource, e.Segment, e.RequestID)
			case e.Outcome == "unknown" && in:
				r.counts["store unknown outcomes that landed"]++
			}
		case "store-stale", "store-raw":
			r.counts[e.Kind+" writes tried"]++
			switch {
			case e.Outcome == "ok" || in:
				r.violate(vStoreAdversary, "%s with fence %d segment %d to %s was accepted", e.Kind, e.Fence, e.Segment, e.Resource)
			case e.Outcome == "denied":
				r.counts[e.Kind+" writes denied"]++
			}
		}
	}
}

// checkReceipts: every receipt the store keeps was written by the
// transaction of a business row stating the same fence, segment, operation
// and payload; the resource's highest fence is the highest row's; and every
// row of that fence has its receipt (the store keeps them all while the
// fence is the highest). A row without a segment leaves no receipt.
func (r *scheduleResult) checkReceipts(res string, rows []storeRow, receipts []storeReceipt, highestAtStore, highestRow int64) {
	byXact := map[string]storeRow{}
	for _, x := range rows {
		byXact[x.xact] = x
	}
	kept := map[string]bool{}
	for _, rc := range receipts {
		r.counts["store receipts kept"]++
		x, ok := byXact[rc.xact]
		switch {
		case !ok:
			r.violate(vStoreReceipts, "%s: receipt of fence %d segment %d (transaction %s) has no business row", res, rc.fence, rc.segment, rc.xact)
		case x.fence != rc.fence || x.segment != rc.segment || x.op != rc.op || x.payload != rc.payload:
			r.violate(vStoreReceipts, "%s: receipt of fence %d segment %d %s %s; its transaction's row states fence %d segment %d %s %s",
				res, rc.fence, rc.segment, rc.op, rc.payload, x.fence, x.segment, x.op, x.payload)
		case x.at.Before(rc.committedAt):
			r.violate(vStoreReceipts, "%s: row seq %d written at %s, before its transaction began (%s)", res, x.seq, x.at.Format(time.RFC3339Nano), rc.committedAt.Format(time.RFC3339Nano))
		}
		kept[rc.xact] = true
	}
	if highestAtStore != highestRow && len(rows) > 0 {
		r.violate(vStoreReceipts, "%s: the store's highest fence is %d, its rows' %d", res, highestAtStore, highestRow)
	}
	for _, x := range rows {
		if x.fence == highestAtStore && !kept[x.xact] {
			r.violate(vStoreReceipts, "%s seq %d: fence %d segment %d (%s) has no receipt", res, x.seq, x.fence, x.segment, x.req)
		}
	}
}
