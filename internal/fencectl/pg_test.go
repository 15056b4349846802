package fencectl

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestRedact: a DSN's password, in any of libpq's spellings, never reaches
// a message.
func TestRedact(t *testing.T) {
	const pw = "s3cr3t-'pw"
	for _, dsn := range []string{
		"postgres://app:s3cr3t-'pw@db.example:5432/billing",
		"postgresql://app:s3cr3t-%27pw@db.example/billing",
		"postgres://app@db.example/billing?password=s3cr3t-%27pw",
		"postgres://app:s3cr3t-'pw@[::1:bad/billing",
		`host=db.example user=app password='s3cr3t-\'pw' dbname=billing`,
		"host=db.example password=s3cr3t-'pw dbname=billing",
	} {
		text := "cannot parse `" + dsn + "`: " + pw
		if got := redact(text, dsn, ""); strings.Contains(got, "s3cr3t") {
			t.Errorf("redact(%q) = %q: the password is still there", dsn, got)
		}
	}
	if got := redact("password "+pw+" refused", "", pw); got != "password xxxxx refused" {
		t.Errorf("redact with the parsed password = %q", got)
	}
}

// TestPGConnectionErrors: no DSN says where one comes from; a server that
// does not answer is named, its password is not.
func TestPGConnectionErrors(t *testing.T) {
	t.Setenv(envDSN, "")
	run := func(args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		if code := Run(context.Background(), args, &out, &errOut); code != 1 {
			t.Fatalf("kubectl fence %v: exit %d, want 1\n%s%s", args, code, out.String(), errOut.String())
		}
		return errOut.String()
	}
	if got := run("pg", "status"); !strings.Contains(got, "give --dsn DSN or set "+envDSN) {
		t.Errorf("pg status without a DSN: %q", got)
	}
	got := run("pg", "install", "--dsn", "postgres://app:hunter2@127.0.0.1:1/billing?connect_timeout=5")
	if !strings.Contains(got, `cannot connect to database "billing" at 127.0.0.1:1 as role "app"`) || strings.Contains(got, "hunter2") {
		t.Errorf("pg install, nothing listening: %q", got)
	}
	t.Setenv(envDSN, "host=127.0.0.1 port=1 user=app password=hunter2 dbname=billing connect_timeout=5")
	got = run("receipts", "--resource", "billing/batch")
	if !strings.Contains(got, "at 127.0.0.1:1") || strings.Contains(got, "hunter2") {
		t.Errorf("receipts --resource with the DSN from %s: %q", envDSN, got)
	}
}

// TestReceiptsShapes: receipts reads an object (FENCEDRESOURCE) or a
// store's resource (--resource), never both, and --dsn needs --resource.
func TestReceiptsShapes(t *testing.T) {
	for line, ok := range map[string]bool{
		"receipts batch": true,
		"receipts fr/batch --operation nightly-42":                                 true,
		"receipts --resource billing/batch":                                        true,
		"receipts --dsn d --resource billing/batch --operation nightly-42 -o json": true,
		"receipts":                            false,
		"receipts batch --resource billing/b": false,
		"receipts batch --dsn d":              false,
		"receipts --dsn d":                    false,
		"pg status --resource a --dsn d":      true,
		"pg status batch":                     false,
		"pg install --worker-role a --worker-role b --break-glass-role c": true,
		"pg install -o name": false,
	} {
		runs, err := invocations("kubectl fence " + line)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := checkInvocation(runs[0]); (err == nil) != ok {
			t.Errorf("%q: check says %v, want accepted=%v", line, err, ok)
		}
	}
}
