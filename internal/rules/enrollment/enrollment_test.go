package enrollment

import (
	"strings"
	"testing"
)

func TestExemptions(t *testing.T) {
	e := NewExemptions("fencekeeper-system", []string{"monitoring", "kube-system"})
	if got := strings.Join(e.Names(), ","); got != "fencekeeper-system,kube-public,kube-system,monitoring" {
		t.Errorf("Names() = %s", got)
	}
	if got := strings.Join(NewExemptions("locks-ops", nil).Names(), ","); got != "locks-ops,kube-public,kube-system" {
		t.Errorf("Names() = %s; want the operator's namespace first, as config/webhook writes it", got)
	}
	for ns, want := range map[string]string{
		"kube-system":        "control plane's own namespace",
		"kube-public":        "control plane's own namespace",
		"fencekeeper-system": "operator's own namespace",
		"monitoring":         "--exempt-namespaces",
	} {
		err := e.Refusal(ns)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "application namespace") {
			t.Errorf("Refusal(%s) = %v; want it to say %q and the fix", ns, err, want)
		}
	}
	if err := e.Refusal("billing"); err != nil {
		t.Errorf("Refusal(billing) = %v; want nil", err)
	}
	var zero Exemptions
	if !zero.Has("kube-system") || !zero.Has("kube-public") || zero.Has("fencekeeper-system") {
		t.Errorf("the zero Exemptions must exempt kube-system and kube-public only: %v", zero.Names())
	}
}

func TestParseExtra(t *testing.T) {
	got, err := ParseExtra(" monitoring, ,kube-node-lease")
	if err != nil || strings.Join(got, ",") != "monitoring,kube-node-lease" {
		t.Errorf("ParseExtra = %v, %v", got, err)
	}
	if got, err := ParseExtra(""); err != nil || got != nil {
		t.Errorf("ParseExtra(\"\") = %v, %v; want nothing", got, err)
	}
	for _, bad := range []string{"Monitoring", "a.b", "-x", strings.Repeat("a", 64)} {
		_, err := ParseExtra("ok," + bad)
		if err == nil || !strings.Contains(err.Error(), "--exempt-namespaces") || !strings.Contains(err.Error(), bad) {
			t.Errorf("ParseExtra(%q) = %v; want an error naming the flag and the value", bad, err)
		}
	}
}
