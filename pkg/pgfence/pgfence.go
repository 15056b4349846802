package pgfence

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// SchemaVersion is the version of the fencekeeper schema this package installs.
const SchemaVersion = 3

// SQLState codes: a refusal, and the warning Shadow raises instead.
const (
	SQLStateRefused = "FK000"
	SQLStateShadow  = "FK001"
	// SQLStateShadowed: begin_segment_enforced met a segment Shadow would
	// let through (Commit then begins it again with begin_segment).
	SQLStateShadowed = "FK002"
	// SQLStateEpochSuperseded: a publication of an issuer epoch below one
	// the store has taken (PublishEpoch).
	SQLStateEpochSuperseded = "FK003"
)

//go:embed sql/*.sql
var migrationFiles embed.FS

// migration is one version's SQL, applied once and in order.
type migration struct {
	version int
	sql     string
}

func migrations() []migration {
	names, _ := fs.Glob(migrationFiles, "sql/*.sql")
	sort.Strings(names)
	out := make([]migration, 0, len(names))
	for i, n := range names {
		b, _ := migrationFiles.ReadFile(n)
		out = append(out, migration{version: i + 1, sql: string(b)})
	}
	return out
}

// Querier is what the package runs SQL through: a *pgx.Conn, a pgxpool.Pool or a pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner starts transactions: *pgx.Conn and pgxpool.Pool are.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// RefusalError is a segment the database refused: the verdict, the message
// (starting with the verdict code) and, for ALREADY_APPLIED, the original receipt.
type RefusalError struct {
	Verdict  fence.Verdict
	Message  string
	Receipt  string
	Resource string
}

func (e *RefusalError) Error() string { return "fenced store refused the segment: " + e.Message }

// AsRefusal reports whether err is a refusal raised by the fencekeeper
// schema (SQLSTATE FK000), and returns it.
func AsRefusal(err error) (*RefusalError, bool) {
	var re *RefusalError
	if errors.As(err, &re) {
		return re, true
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != SQLStateRefused {
		return nil, false
	}
	code, _, _ := strings.Cut(pe.Message, ":")
	return &RefusalError{
		Verdict:  fence.Verdict(code),
		Message:  pe.Message,
		Receipt:  strings.TrimPrefix(pe.Detail, "receipt "),
		Resource: strings.TrimPrefix(pe.Hint, "resource "),
	}, true
}

// InstallOptions names the roles the installation grants to. Every role
// must exist already; Install creates none.
type InstallOptions struct {
	// Version installs up to this version (0: SchemaVersion). Tests of
	// upgrades install an older one first.
	Version int
	// OperatorRole may publish grants, their ends, resources and revocation.
	OperatorRole string
	// WorkerRoles may begin segments and read receipts and resource state.
	WorkerRoles []string
	// BreakGlassRoles may change protected tables outside a segment; every
	// such change is recorded in fencekeeper.break_glass_audit.
	BreakGlassRoles []string
}

// installLock serializes concurrent installs (pg_advisory_xact_lock key).
const installLock = 0x66656e6365 // "fence"

// Install installs or upgrades the fencekeeper schema in one transaction:
// the versions above the installed one, in order, then the grants to the
// named roles. Installing the same version again changes nothing but the
// role grants; an older Version than installed is refused.
func Install(ctx context.Context, db Beginner, o InstallOptions) error {
	want := o.Version
	if want == 0 {
		want = SchemaVersion
	}
	all := migrations()
	if want < 1 || want > len(all) {
		return fmt.Errorf("pgfence: no schema version %d (this package has 1..%d)", want, len(all))
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", installLock); err != nil {
			return err
		}
		have, err := installedVersion(ctx, tx)
		if err != nil {
			return err
		}
		if have > want {
			return fmt.Errorf("pgfence: schema version %d is installed, newer than %d", have, want)
		}
		for _, m := range all[have:want] {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return fmt.Errorf("pgfence: installing schema version %d: %w", m.version, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO fencekeeper.schema_version (version) VALUES ($1)", m.version); err != nil {
				return err
			}
		}
		return grantRoles(ctx, tx, o, want)
	})
}

// InstalledVersion is the schema version in the database (0: none).
func InstalledVersion(ctx context.Context, q Querier) (int, error) { return installedVersion(ctx, q) }

func installedVersion(ctx context.Context, q Querier) (int, error) {
	var exists bool
	if err := q.QueryRow(ctx, "SELECT to_regclass('fencekeeper.schema_version') IS NOT NULL").Scan(&exists); err != nil {
		return 0, err
	}
	if !exists {
		return 0, nil
	}
	var v int
	err := q.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM fencekeeper.schema_version").Scan(&v)
	return v, err
}

var (
	workerFunctions = []string{
		"begin_segment(jsonb)", "find_receipts(text, text)", "resource_state(text)", "published(text)",
	}
	// workerFunctionsV3: what schema version 3 added for the workers.
	workerFunctionsV3   = []string{"begin_segment_enforced(jsonb, text)"}
	operatorFunctionsV3 = []string{"publish_epoch(bigint)"}
	operatorFunctions   = []string{
		"publish_resource(text, text, bigint)", "publish_grant(text, jsonb, timestamptz)",
		"end_grant(text, text, timestamptz)", "publish_revocation(bigint)",
		"find_receipts(text, text)", "resource_state(text)", "published(text)",
	}
	// operatorReads: what `kubectl fence pg status` and `receipts` show.
	operatorReads = []string{"schema_version", "issuer", "resources", "grants", "receipts"}
)

func grantRoles(ctx context.Context, tx pgx.Tx, o InstallOptions, version int) error {
	var stmts []string
	if o.OperatorRole != "" {
		r := pgx.Identifier{o.OperatorRole}.Sanitize()
		stmts = append(stmts, "GRANT USAGE ON SCHEMA fencekeeper TO "+r)
		fns := operatorFunctions
		if version >= 3 {
			fns = append(fns[:len(fns):len(fns)], operatorFunctionsV3...)
		}
		for _, f := range fns {
			stmts = append(stmts, "GRANT EXECUTE ON FUNCTION fencekeeper."+f+" TO "+r)
		}
		reads := operatorReads
		if version >= 2 {
			reads = append(reads[:len(reads):len(reads)], "shadow_refusals", "break_glass_audit")
		}
		for _, t := range reads {
			stmts = append(stmts, "GRANT SELECT ON fencekeeper."+t+" TO "+r)
		}
	}
	for _, w := range o.WorkerRoles {
		r := pgx.Identifier{w}.Sanitize()
		stmts = append(stmts, "GRANT USAGE ON SCHEMA fencekeeper TO "+r)
		fns := workerFunctions
		if version >= 3 {
			fns = append(fns[:len(fns):len(fns)], workerFunctionsV3...)
		}
		for _, f := range fns {
			stmts = append(stmts, "GRANT EXECUTE ON FUNCTION fencekeeper."+f+" TO "+r)
		}
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("pgfence: %s: %w", s, err)
		}
	}
	if len(o.BreakGlassRoles) > 0 && version < 2 {
		return fmt.Errorf("pgfence: break-glass roles need schema version 2")
	}
	for _, b := range o.BreakGlassRoles {
		if _, err := tx.Exec(ctx, "INSERT INTO fencekeeper.break_glass_roles (role_name) VALUES ($1) ON CONFLICT DO NOTHING", b); err != nil {
			return fmt.Errorf("pgfence: break-glass role %q: %w", b, err)
		}
	}
	return nil
}

// Protect puts a business table under the fence of resourceID: every
// INSERT, UPDATE, DELETE or TRUNCATE of it outside a transaction in which
// BeginSegment accepted a segment of resourceID raises FENCE_REQUIRED. The
// table's owner or a superuser calls it.
func Protect(ctx context.Context, q Querier, table, resourceID string) error {
	_, err := q.Exec(ctx, "SELECT fencekeeper.protect($1::regclass, $2)", table, resourceID)
	if err != nil {
		return fmt.Errorf("pgfence: protect %s: %w", table, err)
	}
	return nil
}
