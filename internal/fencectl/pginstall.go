package fencectl

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// pgInstallView is kubectl fence pg install's document.
type pgInstallView struct {
	Database        string   `json:"database"`
	Server          string   `json:"server"`
	Role            string   `json:"role"`
	VersionBefore   int      `json:"versionBefore"`
	Version         int      `json:"version"`
	Changed         bool     `json:"changed"`
	OperatorRole    string   `json:"operatorRole,omitempty"`
	WorkerRoles     []string `json:"workerRoles"`
	BreakGlassRoles []string `json:"breakGlassRoles"`
}

func (o *options) pgInstallCmd() *cobra.Command {
	var dsn string
	var in pgfence.InstallOptions
	cmd := &cobra.Command{
		Use:   "install",
		Short: "Install or upgrade the fencekeeper schema in a PostgreSQL database (idempotent)",
		Long: `Installs the fencekeeper schema (pkg/pgfence) into the database the DSN names,
or upgrades it to this plugin's version, in one transaction, and grants the
named roles what they need. Running it again changes nothing but the role
grants. The roles must exist; install creates none. The DSN's role must be
able to create a schema in the database (a superuser, the database's owner or
a role with CREATE on it) and, once the schema exists, must own it.`,
		Example: `  # Install on a new database: the operator publishes grants, the workers begin segments
  kubectl fence pg install --dsn "postgres://admin@db.example:5432/billing" --operator-role fk_operator --worker-role fk_worker

  # The DSN from the environment (keeps its password out of shell history), two worker fleets and a break-glass role
  kubectl fence pg install --operator-role fk_operator --worker-role fk_batch --worker-role fk_api --break-glass-role fk_dba -o json`,
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
			view, err := s.install(cmd.Context(), in)
			if err != nil {
				return err
			}
			return o.emit(view, nil, func(bool) error {
				o.printInstall(view)
				return nil
			})
		},
	}
	addDSNFlag(cmd, &dsn)
	cmd.Flags().StringVar(&in.OperatorRole, "operator-role", "", "role that publishes grants, their ends and revocation, and reads the store (pg status)")
	cmd.Flags().StringArrayVar(&in.WorkerRoles, "worker-role", nil, "role that begins segments and reads receipts (repeat for more)")
	cmd.Flags().StringArrayVar(&in.BreakGlassRoles, "break-glass-role", nil, "role that may change protected tables outside a segment, audited (repeat for more)")
	o.addOutputFlags(cmd)
	return cmd
}

func (o *options) printInstall(v pgInstallView) {
	note := ""
	if !v.Changed {
		note = " (already installed; role grants applied again)"
	}
	o.printf("fencekeeper schema: version %d → %d%s\n", v.VersionBefore, v.Version, note)
	o.printf("database %q at %s, installed as role %q\n", v.Database, v.Server, v.Role)
	none := func(roles []string) string {
		if len(roles) == 0 {
			return "(none)"
		}
		return strings.Join(roles, ", ")
	}
	op := v.OperatorRole
	if op == "" {
		op = "(none: only the schema's owner can publish grants)"
	}
	o.printf("operator role: %s\nworker roles: %s\nbreak-glass roles: %s\n", op, none(v.WorkerRoles), none(v.BreakGlassRoles))
}

// install checks that the role can install, then runs pgfence.Install and
// reads the version before and after.
func (s *store) install(ctx context.Context, in pgfence.InstallOptions) (pgInstallView, error) {
	if err := s.canInstall(ctx, in); err != nil {
		return pgInstallView{}, err
	}
	const fix = "run install as the schema's owner or a superuser"
	before, err := pgfence.InstalledVersion(ctx, s.conn)
	if err != nil {
		return pgInstallView{}, s.storeError(err, "read the installed schema version", fix)
	}
	if before > pgfence.SchemaVersion {
		return pgInstallView{}, fmt.Errorf("%s has fencekeeper schema version %d, newer than this plugin's %d: use a newer kubectl fence", s.where, before, pgfence.SchemaVersion)
	}
	if err := pgfence.Install(ctx, s.conn, in); err != nil {
		return pgInstallView{}, s.storeError(err, "install the fencekeeper schema", fix)
	}
	after, err := pgfence.InstalledVersion(ctx, s.conn)
	if err != nil {
		return pgInstallView{}, s.storeError(err, "read the installed schema version", fix)
	}
	cfg := s.conn.Config()
	return pgInstallView{
		Database: s.database, Server: hostPort(cfg.Host, cfg.Port), Role: s.user,
		VersionBefore: before, Version: after, Changed: after != before,
		OperatorRole: in.OperatorRole, WorkerRoles: nonNil(in.WorkerRoles), BreakGlassRoles: nonNil(in.BreakGlassRoles),
	}, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// canInstall says, before anything changes, which privilege the DSN's role
// lacks, and which named role does not exist.
func (s *store) canInstall(ctx context.Context, in pgfence.InstallOptions) error {
	var (
		user                          string
		super, canCreate, schemaFound bool
		owner                         string
		owns                          bool
	)
	err := s.conn.QueryRow(ctx, `SELECT current_user, r.rolsuper, has_database_privilege(current_database(), 'CREATE'),
	       n.oid IS NOT NULL, coalesce(pg_get_userbyid(n.nspowner), ''), coalesce(pg_has_role(n.nspowner, 'USAGE'), false)
	  FROM pg_roles r LEFT JOIN pg_namespace n ON n.nspname = 'fencekeeper'
	 WHERE r.rolname = current_user`).Scan(&user, &super, &canCreate, &schemaFound, &owner, &owns)
	if err != nil {
		return s.storeError(err, "read the role's privileges", "check the DSN's role")
	}
	s.user = user
	switch {
	case super:
	case schemaFound && !owns:
		return fmt.Errorf("role %q may not install in %s: the schema fencekeeper exists and is owned by %q; only its owner (or a superuser) can upgrade it and grant on it: run install as %q",
			user, s.where, owner, owner)
	case !schemaFound && !canCreate:
		return fmt.Errorf("role %q may not install in %s: it lacks CREATE on database %q, needed to create the schema fencekeeper; run install as the database's owner or a superuser, or GRANT CREATE ON DATABASE %s TO %s",
			user, s.where, s.database, pgx.Identifier{s.database}.Sanitize(), pgx.Identifier{user}.Sanitize())
	}
	return s.rolesExist(ctx, in)
}

// rolesExist refuses a named role that does not exist: install creates none.
func (s *store) rolesExist(ctx context.Context, in pgfence.InstallOptions) error {
	named := map[string]string{}
	if in.OperatorRole != "" {
		named[in.OperatorRole] = "--operator-role"
	}
	for _, r := range in.WorkerRoles {
		named[r] = "--worker-role"
	}
	for _, r := range in.BreakGlassRoles {
		named[r] = "--break-glass-role"
	}
	names := make([]string, 0, len(named))
	for r := range named {
		names = append(names, r)
	}
	rows, err := s.conn.Query(ctx, "SELECT r FROM unnest($1::text[]) r WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) ORDER BY r", names)
	if err != nil {
		return s.storeError(err, "look the roles up", "check the DSN's role")
	}
	missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return s.storeError(err, "look the roles up", "check the DSN's role")
	}
	if len(missing) > 0 {
		var which []string
		for _, r := range missing {
			which = append(which, fmt.Sprintf("%q (%s)", r, named[r]))
		}
		return fmt.Errorf("no such role in %s: %s; install creates no role: create it first (CREATE ROLE name LOGIN)", s.where, strings.Join(which, ", "))
	}
	return nil
}
