package webhooks

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func TestEnforcementRatchet(t *testing.T) {
	fr := func(m locksv1.EnforcementMode) *locksv1.FencedResource {
		return &locksv1.FencedResource{Spec: locksv1.FencedResourceSpec{Enforcement: m}}
	}
	if errs := validateEnforcementRatchet(fr(locksv1.EnforcementShadow), fr(locksv1.EnforcementEnforce)); len(errs) > 0 {
		t.Fatal(errs)
	}
	if errs := validateEnforcementRatchet(fr(locksv1.EnforcementEnforce), fr(locksv1.EnforcementShadow)); len(errs) != 1 || errs[0].Field != "spec.enforcement" {
		t.Fatalf("Enforce -> Shadow: %v", errs)
	}
}

func TestLockGrantValidation(t *testing.T) {
	fr := &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Name: "batch"},
		Spec: locksv1.FencedResourceSpec{AllowedOwners: []string{"a", "b"}, OperationCategories: []string{"settle"}}}
	lg := func(owner, req, cat string) *locksv1.LockGrant {
		return &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Name: locksv1.LockGrantName("batch", owner, req)},
			Spec: locksv1.LockGrantSpec{Resource: "batch", Owner: owner, RequestID: req, OperationCategory: cat,
				Lease: "lease", OperationRoot: "sha256:" + strings.Repeat("0", 64)}}
	}
	renamed := func(l *locksv1.LockGrant, name string) *locksv1.LockGrant { l.Name = name; return l }
	mine := locksv1.LockGrantName("batch", "a", "r")
	cases := map[string]struct {
		user  string
		lg    *locksv1.LockGrant
		field string // the path the error names ("" when valid)
		want  string
	}{
		"ok":                     {"a", lg("a", "r", "settle"), "", ""},
		"other owner":            {"b", lg("a", "r", "settle"), "spec.owner", "must equal the requesting user"},
		"not allowed":            {"c", lg("c", "r", "settle"), "spec.owner", "allowedOwners"},
		"category":               {"a", lg("a", "r", "refund"), "spec.operationCategory", `supported values: "settle"`},
		"written by hand":        {"a", renamed(lg("a", "r", "settle"), "nightly-import"), "", ""},
		"generateName":           {"a", renamed(lg("a", "r", "settle"), ""), "", ""},
		"uppercase hex is free":  {"a", renamed(lg("a", "r", "settle"), "batch-0123456789ABCDEF"), "", ""},
		"17 hex digits are free": {"a", renamed(lg("a", "r", "settle"), "batch-0123456789abcdef0"), "", ""},
		// b squats a's requestID under the name a's client will use.
		"another owner's name": {"b", renamed(lg("b", "r", "settle"), mine), "metadata.name",
			`must be "` + locksv1.LockGrantName("batch", "b", "r") + `": a name ending in a dash and 16 lowercase hex digits is reserved`},
		"another request's name":     {"a", renamed(lg("a", "r", "settle"), locksv1.LockGrantName("batch", "a", "q")), "metadata.name", `must be "` + mine + `"`},
		"a made-up name of the form": {"a", renamed(lg("a", "r", "settle"), "nightly-2026071912345678"), "metadata.name", `must be "` + mine + `"`},
		"NUL in the requestID":       {"a", lg("a", "r\x00s", "settle"), "spec.requestID", "must not contain the NUL character"},
	}
	for name, c := range cases {
		errs := validateLockGrantCreate(c.user, "", c.lg, fr)
		switch {
		case c.field == "" && len(errs) > 0:
			t.Errorf("%s: %v", name, errs)
		case c.field != "" && (len(errs) != 1 || errs[0].Field != c.field || !strings.Contains(errs[0].Error(), c.want)):
			t.Errorf("%s: got %v, want %s: …%s…", name, errs, c.field, c.want)
		}
	}
}

func TestChangedIgnoresServerMetadataAndFinishingDeletions(t *testing.T) {
	mk := func(mutate func(u *unstructured.Unstructured)) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": "x", "resourceVersion": "1", "finalizers": []any{"a", "b"}}, "data": map[string]any{"k": "v"}}}
		if mutate != nil {
			mutate(u)
		}
		return u
	}
	if changed(mk(nil), mk(func(u *unstructured.Unstructured) { u.SetResourceVersion("2") })) {
		t.Error("resourceVersion counted as a change")
	}
	if !changed(mk(nil), mk(func(u *unstructured.Unstructured) { u.Object["data"] = map[string]any{"k": "w"} })) {
		t.Error("data change missed")
	}
	if !changed(mk(nil), mk(func(u *unstructured.Unstructured) { u.SetFinalizers([]string{"a"}) })) {
		t.Error("finalizer removal on a live object needs a fence")
	}
	now := metav1.Now()
	terminating := func(u *unstructured.Unstructured) { u.SetDeletionTimestamp(&now) }
	if changed(mk(terminating), mk(func(u *unstructured.Unstructured) { terminating(u); u.SetFinalizers([]string{"a"}) })) {
		t.Error("dropping a finalizer of a terminating object needs no fence")
	}
}

func TestValidateStores(t *testing.T) {
	ref := func(name, secret, key string) locksv1.StoreReference {
		return locksv1.StoreReference{Name: name, SecretRef: locksv1.StoreSecretReference{Name: secret, Key: key}}
	}
	many := make([]locksv1.StoreReference, 0, locksv1.MaxStores+1)
	for i := 0; i <= locksv1.MaxStores; i++ {
		many = append(many, ref("db-"+string(rune('a'+i)), "s", ""))
	}
	cases := map[string]struct {
		stores []locksv1.StoreReference
		field  string // the path the error names ("" when valid)
		want   string
	}{
		"none":              {nil, "", ""},
		"ok":                {[]locksv1.StoreReference{ref("ledger", "ledger-db", ""), ref("audit", "audit.db", "url")}, "", ""},
		"name not a label":  {[]locksv1.StoreReference{ref("Bad_Name", "s", "")}, "spec.stores[0].name", "a DNS label"},
		"name empty":        {[]locksv1.StoreReference{ref("", "s", "")}, "spec.stores[0].name", "a DNS label"},
		"name too long":     {[]locksv1.StoreReference{ref(strings.Repeat("a", 64), "s", "")}, "spec.stores[0].name", "more than 63 bytes"},
		"duplicate name":    {[]locksv1.StoreReference{ref("db", "s", ""), ref("db", "t", "")}, "spec.stores[1].name", "Duplicate"},
		"secret not a name": {[]locksv1.StoreReference{ref("db", "not a name", "")}, "spec.stores[0].secretRef.name", "a DNS subdomain"},
		"secret too long":   {[]locksv1.StoreReference{ref("db", strings.Repeat("a", 254), "")}, "spec.stores[0].secretRef.name", "more than 253 bytes"},
		"key with a slash":  {[]locksv1.StoreReference{ref("db", "s", "a/b")}, "spec.stores[0].secretRef.key", "a Secret key"},
		"key too long":      {[]locksv1.StoreReference{ref("db", "s", strings.Repeat("k", 254))}, "spec.stores[0].secretRef.key", "more than 253 bytes"},
		"too many":          {many, "spec.stores", "at most 8"},
	}
	for name, c := range cases {
		errs := validateStores(c.stores)
		switch {
		case c.field == "" && len(errs) > 0:
			t.Errorf("%s: %v", name, errs)
		case c.field != "" && (len(errs) == 0 || errs[0].Field != c.field || !strings.Contains(errs[0].Error(), c.want)):
			t.Errorf("%s: want %s: %q, got %v", name, c.field, c.want, errs)
		}
	}
}
