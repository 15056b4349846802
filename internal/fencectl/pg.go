package fencectl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"
)

// The PostgreSQL commands (pg install, pg status, receipts --dsn) talk to a
// fenced store (pkg/pgfence), not to the API server: the connection is a
// libpq DSN, never the kubeconfig.

// envDSN is where --dsn comes from when it is not given, so that a DSN with
// a password stays out of shell history.
const envDSN = "FENCEKEEPER_PG_DSN"

// connectTimeout bounds a connection attempt whose DSN sets no connect_timeout.
const connectTimeout = 10 * time.Second

// pgCodeInsufficientPrivilege is SQLSTATE 42501.
const pgCodeInsufficientPrivilege = "42501"

func (o *options) pgCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pg",
		Short: "Install and inspect the fencekeeper schema of a PostgreSQL fenced store (pkg/pgfence)",
		Example: `  # Install the schema, then look at the store as the operator's role
  kubectl fence pg install --dsn "postgres://admin@db.example:5432/billing" --operator-role fk_operator --worker-role fk_worker
  kubectl fence pg status --dsn "postgres://fk_operator@db.example:5432/billing"`,
	}
	cmd.AddCommand(o.pgInstallCmd(), o.pgStatusCmd())
	return cmd
}

// addDSNFlag gives cmd --dsn, read with dsnOf.
func addDSNFlag(cmd *cobra.Command, dsn *string) {
	cmd.Flags().StringVar(dsn, "dsn", "", "PostgreSQL connection string (postgres://USER@HOST:PORT/DB or libpq key=value); default $"+envDSN)
}

// dsnOf is --dsn, else $FENCEKEEPER_PG_DSN.
func dsnOf(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if env := os.Getenv(envDSN); env != "" {
		return env, nil
	}
	return "", fmt.Errorf("no database: give --dsn DSN or set %s (keeps a password out of shell history)", envDSN)
}

// store is a connection to a fenced store, described for messages without
// its password.
type store struct {
	conn *pgx.Conn
	// where: database "billing" at db.example:5432.
	where    string
	database string
	user     string
	password string
}

// connectStore opens a connection to the store dsn names. Every error
// names the host and database and carries no password.
func connectStore(ctx context.Context, dsn string) (*store, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("bad --dsn: %s", redact(err.Error(), dsn, ""))
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = connectTimeout
	}
	s := &store{
		where:    fmt.Sprintf("database %q at %s", cfg.Database, hostPort(cfg.Host, cfg.Port)),
		database: cfg.Database, user: cfg.User, password: cfg.Password,
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to %s as role %q: %s", s.where, s.user, s.redact(err))
	}
	s.conn = conn
	return s, nil
}

func (s *store) close() { _ = s.conn.Close(context.Background()) }

// redact is err's text without the store's password.
func (s *store) redact(err error) string { return redact(err.Error(), "", s.password) }

// hostPort is where the server is: host:port, or a unix socket's path.
func hostPort(host string, port uint16) string {
	if strings.HasPrefix(host, "/") {
		return fmt.Sprintf("%s/.s.PGSQL.%d", host, port)
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// kvPassword finds a password in a libpq key=value DSN: quoted (with
// backslash escapes) or up to the next space.
var kvPassword = regexp.MustCompile(`password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)`)

// urlPassword finds the password of a URL DSN that does not parse.
var urlPassword = regexp.MustCompile(`^postgres(?:ql)?://[^:/@]*:(.+)@`)

// redact removes from text the password of dsn (URL or key=value form) and
// the password given, replacing each with xxxxx.
func redact(text, dsn, password string) string {
	secrets := []string{password}
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		p, _ := u.User.Password()
		secrets = append(secrets, p, url.QueryEscape(p), url.PathEscape(p))
	}
	if m := urlPassword.FindStringSubmatch(dsn); m != nil {
		secrets = append(secrets, m[1])
	}
	for _, m := range kvPassword.FindAllStringSubmatch(dsn, -1) {
		unquoted := strings.NewReplacer(`\'`, `'`, `\\`, `\`).Replace(strings.Trim(m[1], "'"))
		secrets = append(secrets, m[1], unquoted)
	}
	if u, err := url.Parse(dsn); err == nil {
		if p := u.Query().Get("password"); p != "" {
			secrets = append(secrets, p, url.QueryEscape(p))
		}
	}
	for _, p := range secrets {
		if p != "" {
			text = strings.ReplaceAll(text, p, "xxxxx")
		}
	}
	return text
}

// privilegeError explains SQLSTATE 42501 (what was refused, to whom), or
// returns nil for any other error.
func (s *store) privilegeError(err error, doing, fix string) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != pgCodeInsufficientPrivilege {
		return nil
	}
	return fmt.Errorf("role %q may not %s in %s: %s; %s", s.user, doing, s.where, redact(pe.Message, "", s.password), fix)
}

// storeError is err from the store, explained when a privilege is missing.
func (s *store) storeError(err error, doing, fix string) error {
	if pe := s.privilegeError(err, doing, fix); pe != nil {
		return pe
	}
	return fmt.Errorf("cannot %s in %s as role %q: %s", doing, s.where, s.user, s.redact(err))
}
