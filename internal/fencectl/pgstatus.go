package fencectl

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// recentWindow is how far back pg status counts shadow refusals and
// break-glass changes as recent.
const recentWindow = 24 * time.Hour

// pgStatusView is kubectl fence pg status's document.
type pgStatusView struct {
	Database            string             `json:"database"`
	Server              string             `json:"server"`
	Role                string             `json:"role"`
	Installed           bool               `json:"installed"`
	SchemaVersion       int                `json:"schemaVersion"`
	PluginSchemaVersion int                `json:"pluginSchemaVersion"`
	Install             string             `json:"install,omitempty"`
	RevokedBelowEpoch   int64              `json:"revokedBelowEpoch"`
	Resources           []pgResourceStatus `json:"resources"`
}

// pgResourceStatus is one resource's row at the store.
type pgResourceStatus struct {
	Resource       string       `json:"resource"`
	Mode           string       `json:"mode"`
	Generation     int64        `json:"generation"`
	HighestFence   int64        `json:"highestFence"`
	OperationRoot  string       `json:"operationRoot,omitempty"`
	LastSegment    int64        `json:"lastSegment"`
	Holder         *pgHolder    `json:"holder"`
	Receipts       int64        `json:"receipts"`
	ShadowRefusals *recentCount `json:"shadowRefusals,omitempty"`
	BreakGlass     *recentCount `json:"breakGlassAudit,omitempty"`
	PublishedAt    time.Time    `json:"publishedAt"`
}

// pgHolder is the published, unended grant with the highest fence: the
// grant the store lets write.
type pgHolder struct {
	Owner       string    `json:"owner"`
	Fence       int64     `json:"fence"`
	IssuerEpoch int64     `json:"issuerEpoch"`
	GrantDigest string    `json:"grantDigest"`
	ExpiresAt   time.Time `json:"expiresAt"`
	Expired     bool      `json:"expired"`
}

// recentCount counts rows of an audit table for one resource.
type recentCount struct {
	Last24h  int64      `json:"last24h"`
	Total    int64      `json:"total"`
	LatestAt *time.Time `json:"latestAt,omitempty"`
}

// installHint is the command that installs the schema, for "not installed".
const installHint = "kubectl fence pg install --dsn DSN --operator-role ROLE --worker-role ROLE (as the database's owner)"

// operatorFix says how to read what pg status reads.
const operatorFix = "pg status reads the fencekeeper tables as the operator's role (the role given to pg install --operator-role) or the schema's owner"

func (o *options) pgStatusCmd() *cobra.Command {
	var dsn, resource string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the fencekeeper schema of a PostgreSQL database and each resource's fence state (read-only)",
		Long: `Shows the installed schema version (or how to install it), the revoked-below
epoch, and per resource: mode, policy generation, highest fence, last segment,
the holder (the published, unended grant with the highest fence, and when it
expires), the receipts kept, and the shadow refusals and break-glass changes
of the last 24 hours. Read-only; run it as the operator's role.`,
		Example: `  # Every resource of the store, as the operator's role
  kubectl fence pg status --dsn "postgres://fk_operator@db.example:5432/billing"

  # One resource, as JSON; the DSN from FENCEKEEPER_PG_DSN
  kubectl fence pg status --resource billing/invoice-batch -o json
  kubectl fence pg status -o jsonpath='{.schemaVersion}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dsn, err := dsnOf(dsn)
			if err != nil {
				return err
			}
			s, err := connectStore(cmd.Context(), dsn)
			if err != nil {
				return err
			}
			defer s.close()
			view, err := s.status(cmd.Context(), resource)
			if err != nil {
				return err
			}
			return o.emit(view, nil, func(bool) error { return o.printPGStatus(view) })
		},
	}
	addDSNFlag(cmd, &dsn)
	cmd.Flags().StringVar(&resource, "resource", "", "show this resource ID only")
	o.addOutputFlags(cmd)
	return cmd
}

func (o *options) printPGStatus(v pgStatusView) error {
	if !v.Installed {
		o.printf("fencekeeper schema: not installed in %s\nInstall it with: %s\n", describeDB(v), v.Install)
		return nil
	}
	o.printf("fencekeeper schema: version %d in %s (as role %q)\n", v.SchemaVersion, describeDB(v), v.Role)
	if v.SchemaVersion < v.PluginSchemaVersion {
		o.printf("This plugin installs version %d: upgrade with kubectl fence pg install.\n", v.PluginSchemaVersion)
	}
	o.printf("revoked below epoch: %d\n", v.RevokedBelowEpoch)
	if len(v.Resources) == 0 {
		o.printf("No resource is published at this store yet (the operator publishes each FencedResource naming it).\n")
		return nil
	}
	tw := o.table("RESOURCE", "MODE", "GEN", "FENCE", "SEGMENT", "HOLDER", "EXPIRES", "RECEIPTS", "SHADOW-24H", "BREAK-GLASS-24H")
	for _, r := range v.Resources {
		holder, expires := "-", "-"
		if h := r.Holder; h != nil {
			holder = fmt.Sprintf("%s (fence %d)", h.Owner, h.Fence)
			expires = until(h.ExpiresAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\t%d\t%s\t%s\n", r.Resource, r.Mode, r.Generation, r.HighestFence, r.LastSegment,
			holder, expires, r.Receipts, recent(r.ShadowRefusals), recent(r.BreakGlass))
	}
	return tw.Flush()
}

func describeDB(v pgStatusView) string { return fmt.Sprintf("database %q at %s", v.Database, v.Server) }

// recent is a recentCount's last-24h count, "-" when the schema has no such table.
func recent(c *recentCount) string {
	if c == nil {
		return "-"
	}
	return strconv.FormatInt(c.Last24h, 10)
}

// status reads the schema version, the revocation and the resources.
func (s *store) status(ctx context.Context, resource string) (pgStatusView, error) {
	cfg := s.conn.Config()
	v := pgStatusView{Database: s.database, Server: hostPort(cfg.Host, cfg.Port), Role: s.user,
		PluginSchemaVersion: pgfence.SchemaVersion, Resources: []pgResourceStatus{}}
	var err error
	if v.SchemaVersion, err = pgfence.InstalledVersion(ctx, s.conn); err != nil {
		return v, s.storeError(err, "read the schema version", operatorFix)
	}
	if v.Installed = v.SchemaVersion > 0; !v.Installed {
		if resource != "" {
			return v, fmt.Errorf("the fencekeeper schema is not installed in %s, so it serves no resource %q; install it with: %s", s.where, resource, installHint)
		}
		v.Install = installHint
		return v, nil
	}
	if err := s.conn.QueryRow(ctx, "SELECT revoked_below_epoch FROM fencekeeper.issuer").Scan(&v.RevokedBelowEpoch); err != nil {
		return v, s.storeError(err, "read fencekeeper.issuer", operatorFix)
	}
	if v.Resources, err = s.resources(ctx, resource, v.SchemaVersion >= 2); err != nil {
		return v, err
	}
	if resource != "" && len(v.Resources) == 0 {
		return v, fmt.Errorf("no resource %q is published at %s (pg status without --resource lists those that are)", resource, s.where)
	}
	return v, nil
}

// resourcesSQL reads every resource (or the one of $1) with its holder and
// receipt count; with $2, the recent and total rows of the version 2 audit
// tables too (-1 where the schema has none).
const resourcesSQL = `
SELECT r.resource_id, r.mode, r.generation, r.highest_fence, r.root, r.last_segment, r.published_at,
       h.digest, h.fence, coalesce(h.grant_doc->>'owner', ''), coalesce((h.grant_doc->>'issuerEpoch')::bigint, 0), h.expires_at,
       (SELECT count(*) FROM fencekeeper.receipts x WHERE x.resource_id = r.resource_id)
  FROM fencekeeper.resources r
  LEFT JOIN LATERAL (SELECT g.digest, g.fence, g.grant_doc, g.expires_at FROM fencekeeper.grants g
                      WHERE g.resource_id = r.resource_id AND g.ended_at IS NULL ORDER BY g.fence DESC LIMIT 1) h ON true
 WHERE $1 = '' OR r.resource_id = $1
 ORDER BY r.resource_id`

// auditSQL counts one audit table's rows per resource: in the window, in all, the latest.
const auditSQL = `SELECT resource_id, count(*) FILTER (WHERE at > now() - make_interval(secs => $1)), count(*), max(at)
  FROM fencekeeper.%s WHERE resource_id IS NOT NULL AND ($2 = '' OR resource_id = $2) GROUP BY resource_id`

func (s *store) resources(ctx context.Context, resource string, audited bool) ([]pgResourceStatus, error) {
	rows, err := s.conn.Query(ctx, resourcesSQL, resource)
	if err != nil {
		return nil, s.storeError(err, "read fencekeeper.resources", operatorFix)
	}
	out, err := pgx.CollectRows(rows, scanResource)
	if err != nil {
		return nil, s.storeError(err, "read fencekeeper.resources", operatorFix)
	}
	if !audited {
		return out, nil
	}
	for _, table := range []string{"shadow_refusals", "break_glass_audit"} {
		counts, err := s.auditCounts(ctx, table, resource)
		if err != nil {
			return nil, err
		}
		for i := range out {
			c := counts[out[i].Resource]
			if table == "shadow_refusals" {
				out[i].ShadowRefusals = &c
			} else {
				out[i].BreakGlass = &c
			}
		}
	}
	return out, nil
}

func scanResource(row pgx.CollectableRow) (pgResourceStatus, error) {
	var r pgResourceStatus
	var digest *string
	var hf *int64
	var h pgHolder
	var expires *time.Time
	err := row.Scan(&r.Resource, &r.Mode, &r.Generation, &r.HighestFence, &r.OperationRoot, &r.LastSegment, &r.PublishedAt,
		&digest, &hf, &h.Owner, &h.IssuerEpoch, &expires, &r.Receipts)
	if err != nil || digest == nil {
		return r, err
	}
	h.GrantDigest, h.Fence = *digest, *hf
	if expires != nil {
		h.ExpiresAt = *expires
		h.Expired = !time.Now().Before(*expires)
	}
	r.Holder = &h
	return r, nil
}

func (s *store) auditCounts(ctx context.Context, table, resource string) (map[string]recentCount, error) {
	rows, err := s.conn.Query(ctx, fmt.Sprintf(auditSQL, table), recentWindow.Seconds(), resource)
	if err != nil {
		return nil, s.storeError(err, "read fencekeeper."+table, operatorFix)
	}
	out := map[string]recentCount{}
	for rows.Next() {
		var id string
		var c recentCount
		if err := rows.Scan(&id, &c.Last24h, &c.Total, &c.LatestAt); err != nil {
			rows.Close()
			return nil, s.storeError(err, "read fencekeeper."+table, operatorFix)
		}
		out[id] = c
	}
	if err := rows.Err(); err != nil {
		return nil, s.storeError(err, "read fencekeeper."+table, operatorFix)
	}
	return out, nil
}
