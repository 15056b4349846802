// Package pgfence_test proves pkg/pgfence on a real PostgreSQL started from
// the machine's server binaries: the same cases as pkg/fence's Decide, the
// protected-table trigger, the roles' privileges, upgrades and faults.
package pgfence_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekeeper/fencekeeper/internal/pgserver"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// server is the suite's PostgreSQL; each test takes a database of its own.
var server *pgserver.Server

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	s, err := pgserver.Start(ctx, pgserver.Options{})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting PostgreSQL:", err)
		os.Exit(1)
	}
	server = s
	code := m.Run()
	_ = s.Stop()
	os.Exit(code)
}

// Roles every store database of the suite uses (roles are cluster-wide).
const (
	operatorRole   = "fk_operator"
	workerRole     = "fk_worker"
	breakGlassRole = "fk_breakglass"
	ownerRole      = "fk_app_owner"
)

var rolesOnce = map[string]bool{}

// store is one test's database with the schema installed: admin is the
// superuser, worker and operator log in as those roles.
type store struct {
	name                    string
	admin, worker, operator *pgx.Conn
}

func newStore(t *testing.T, o pgfence.InstallOptions) *store {
	t.Helper()
	ctx := context.Background()
	if !rolesOnce["done"] {
		for _, r := range []string{operatorRole, workerRole, breakGlassRole, ownerRole} {
			if err := server.Exec(ctx, "postgres", fmt.Sprintf("DO $$ BEGIN CREATE ROLE %s LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$", r)); err != nil {
				t.Fatal(err)
			}
		}
		rolesOnce["done"] = true
	}
	name := fmt.Sprintf("t%d", time.Now().UnixNano())
	if err := server.CreateDatabase(ctx, name); err != nil {
		t.Fatal(err)
	}
	s := &store{name: name, admin: connect(t, server.DSN(name))}
	if o.OperatorRole == "" {
		o.OperatorRole = operatorRole
	}
	if o.WorkerRoles == nil {
		o.WorkerRoles = []string{workerRole}
	}
	if err := pgfence.Install(ctx, s.admin, o); err != nil {
		t.Fatal(err)
	}
	s.worker = connect(t, server.DSN(name)+" user="+workerRole)
	s.operator = connect(t, server.DSN(name)+" user="+operatorRole)
	return s
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatalf("connect %s: %v", dsn, err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}
