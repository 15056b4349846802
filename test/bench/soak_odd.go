package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// Odd inputs: LockGrants and FencedResources with multibyte, at-limit,
// over-limit, badly encoded and huge fields, sent as raw JSON (so invalid
// UTF-8 and lone surrogate escapes reach the API server as written). Each is
// refused at admission or admitted; an admitted LockGrant must then be
// served or Denied, and an admitted FencedResource must serve a request.

// lit is s as a JSON string literal (s must be valid UTF-8).
func lit(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// decodeLit is what a JSON decoder makes of string literal l: invalid UTF-8
// and lone surrogates become U+FFFD, as in the API server.
func decodeLit(l string) string {
	var s string
	_ = json.Unmarshal([]byte(l), &s)
	return s
}

func multibyte(n int) string { return strings.Repeat("ü", n) }

// field is one spec member: its name and its value as raw JSON.
type field struct{ k, v string }

// rawObject is the JSON of a fencekeeper object in the tenant's namespace;
// annotations is a raw JSON object or "".
func rawObject(kind, name, annotations string, spec []field) []byte {
	var b strings.Builder
	b.WriteString(`{"apiVersion":"locks.fencekeeper.dev/v1alpha1","kind":"` + kind + `","metadata":{"name":` + lit(name) + `,"namespace":"` + soakTenantNS + `"`)
	if annotations != "" {
		b.WriteString(`,"annotations":` + annotations)
	}
	b.WriteString(`},"spec":{`)
	for i, f := range spec {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(lit(f.k) + ":" + f.v)
	}
	b.WriteString("}}")
	return []byte(b.String())
}

// lgSpec describes an odd LockGrant; empty members take the defaults
// (resource tenantOdd, the tenant as owner, requestID odd-<n>, lease "odd",
// the request's own name). Literals are raw JSON.
type lgSpec struct {
	resource, owner, name string
	reqLit, leaseLit, cat string
	annotations           string
}

func (t *tenantSide) lgBody(n int, s lgSpec) (string, []byte) {
	if s.resource == "" {
		s.resource = tenantOdd
	}
	if s.owner == "" {
		s.owner = t.user
	}
	if s.reqLit == "" {
		s.reqLit = lit(fmt.Sprintf("odd-%d", n))
	}
	if s.leaseLit == "" {
		s.leaseLit = lit("odd")
	}
	req := decodeLit(s.reqLit)
	if s.name == "" {
		s.name = locksv1.LockGrantName(s.resource, s.owner, req)
	}
	spec := []field{{"resource", lit(s.resource)}, {"owner", lit(s.owner)}, {"requestID", s.reqLit}, {"lease", s.leaseLit},
		{"operationRoot", lit(lockclient.OperationRoot(s.resource + "/" + req))}}
	if s.cat != "" {
		spec = append(spec, field{"operationCategory", s.cat})
	}
	return s.name, rawObject("LockGrant", s.name, s.annotations, spec)
}

// frSpec describes an odd FencedResource; category is what a request for
// it asks (its only allowed operationCategory, when set).
type frSpec struct {
	name, idLit, lease string
	owners             []string
	category, target   string
	annotations        string
}

func (t *tenantSide) frBody(s frSpec) []byte {
	if s.idLit == "" {
		s.idLit = lit(soakTenantNS + "/" + s.name)
	}
	if s.lease == "" {
		s.lease = "1"
	}
	spec := []field{{"resourceID", s.idLit}, {"leaseDurationSeconds", s.lease}, {"enforcement", lit("Enforce")}}
	if len(s.owners) > 0 {
		b, _ := json.Marshal(s.owners)
		spec = append(spec, field{"allowedOwners", string(b)})
	}
	if s.category != "" {
		spec = append(spec, field{"operationCategories", "[" + lit(s.category) + "]"})
	}
	if s.target != "" {
		spec = append(spec, field{"target", `{"apiVersion":"v1","kind":"ConfigMap","name":` + lit(s.target) + `}`})
	}
	return rawObject("FencedResource", s.name, s.annotations, spec)
}

// dnsName is a DNS subdomain of length characters ending in n's digits, in
// labels of 63 with a dot also at dotAt when it is > 0.
func dnsName(length, n, dotAt int) string {
	b := bytes.Repeat([]byte("a"), length)
	for i := 63; i < length-1; i += 64 {
		b[i] = '.'
	}
	if dotAt > 0 {
		b[dotAt] = '.'
	}
	copy(b[length-6:], fmt.Sprintf("%06d", n%1_000_000))
	return string(b)
}

// oddCase is one odd input; build returns the object's name and JSON.
type oddCase struct {
	name  string
	entry bool // a FencedResource (else a LockGrant)
	build func(t *tenantSide, n int) (string, []byte)
	// category is what the request for an admitted entry asks.
	category string
}

func lgCase(name string, s func(n int) lgSpec) oddCase {
	return oddCase{name: name, build: func(t *tenantSide, n int) (string, []byte) { return t.lgBody(n, s(n)) }}
}

func frCase(name, category string, s func(t *tenantSide, n int) frSpec) oddCase {
	return oddCase{name: name, entry: true, category: category, build: func(t *tenantSide, n int) (string, []byte) {
		spec := s(t, n)
		if spec.name == "" {
			spec.name = fmt.Sprintf("odd-%d", n)
		}
		return spec.name, t.frBody(spec)
	}}
}

// atLimit is 128 characters and 253 bytes (both limits of requestID) ending in n.
func atLimit(n int) string { return multibyte(125) + fmt.Sprintf("%03d", n%1000) }

var oddCases = []oddCase{
	lgCase("LockGrant requestID 128 × ü (256 bytes)", func(int) lgSpec { return lgSpec{reqLit: lit(multibyte(128))} }),
	lgCase("LockGrant requestID 128 chars = 253 bytes", func(n int) lgSpec { return lgSpec{reqLit: lit(atLimit(n))} }),
	lgCase("LockGrant requestID 129 ASCII chars", func(n int) lgSpec { return lgSpec{reqLit: lit(strings.Repeat("r", 121) + fmt.Sprintf("%08d", n))} }),
	lgCase("LockGrant lease 128 × ü (256 bytes)", func(int) lgSpec { return lgSpec{leaseLit: lit(multibyte(128))} }),
	lgCase("LockGrant lease 253 bytes", func(int) lgSpec { return lgSpec{leaseLit: lit(multibyte(126) + "a")} }),
	lgCase("LockGrant operationCategory 128 × ü", func(int) lgSpec { return lgSpec{cat: lit(multibyte(128))} }),
	lgCase("LockGrant operationCategory 253 bytes", func(int) lgSpec { return lgSpec{cat: lit(multibyte(126) + "a")} }),
	lgCase("LockGrant all strings at 253 bytes", func(n int) lgSpec {
		return lgSpec{reqLit: lit(atLimit(n)), leaseLit: lit(multibyte(126) + "a"), cat: lit(multibyte(126) + "a")}
	}),
	lgCase(`LockGrant requestID with \ud800 escape`, func(n int) lgSpec { return lgSpec{reqLit: fmt.Sprintf(`"odd-%d-\ud800"`, n)} }),
	lgCase("LockGrant requestID with raw 0xff 0xfe", func(n int) lgSpec { return lgSpec{reqLit: fmt.Sprintf("\"odd-%d-\xff\xfe\"", n)} }),
	lgCase("LockGrant requestID with NUL, ESC", func(n int) lgSpec { return lgSpec{reqLit: fmt.Sprintf(`"odd-%d-\u0000\u001b"`, n)} }),
	lgCase("LockGrant annotation key with ü", func(int) lgSpec { return lgSpec{annotations: `{"tenant.example/ü":"x"}`} }),
	lgCase("LockGrant annotation \\ud800 + 0xff", func(int) lgSpec { return lgSpec{annotations: "{\"tenant.example/v\":\"\\ud800\xff\"}"} }),
	lgCase("LockGrant resource 128 × ü (missing)", func(int) lgSpec { return lgSpec{resource: multibyte(128)} }),
	lgCase("LockGrant owner: another user", func(int) lgSpec { return lgSpec{owner: "someone-else"} }),
	lgCase("LockGrant lease pod:<uid>, no pod", func(int) lgSpec { return lgSpec{leaseLit: lit("pod:6a1c3bd6-0000-4000-8000-000000000000")} }),
	lgCase("LockGrant name not the request's", func(n int) lgSpec { return lgSpec{name: fmt.Sprintf("odd-wrong-name-%d", n)} }),
	frCase("FencedResource resourceID 128 × ü", "", func(*tenantSide, int) frSpec { return frSpec{idLit: lit(multibyte(128))} }),
	frCase("FencedResource resourceID 253 bytes", "", func(_ *tenantSide, n int) frSpec { return frSpec{idLit: lit(atLimit(n))} }),
	frCase(`FencedResource resourceID \ud800, 0xff, NUL`, "", func(_ *tenantSide, n int) frSpec {
		return frSpec{idLit: fmt.Sprintf("\"odd/%d-\\ud800\xff\\u0000\"", n)}
	}),
	frCase("FencedResource name 253 chars", "", func(_ *tenantSide, n int) frSpec { return frSpec{name: dnsName(253, n, 0), idLit: shortID(n)} }),
	frCase("FencedResource name 253 chars, '.' at 200", "", func(_ *tenantSide, n int) frSpec {
		return frSpec{name: dnsName(253, n, 199), idLit: shortID(n)}
	}),
	frCase("FencedResource name 254 chars", "", func(_ *tenantSide, n int) frSpec { return frSpec{name: dnsName(254, n, 0), idLit: shortID(n)} }),
	frCase("FencedResource 64 allowedOwners × 252 bytes", "", func(t *tenantSide, _ int) frSpec { return frSpec{owners: owners(t.user, 64)} }),
	frCase("FencedResource 65 allowedOwners", "", func(t *tenantSide, _ int) frSpec { return frSpec{owners: owners(t.user, 65)} }),
	frCase("FencedResource category 253 × ü (506 bytes)", multibyte(253), func(*tenantSide, int) frSpec { return frSpec{category: multibyte(253)} }),
	frCase("FencedResource target: missing, 253 chars", "", func(t *tenantSide, n int) frSpec {
		t.claimed()
		return frSpec{target: dnsName(253, n, 0)}
	}),
	frCase("FencedResource largest admitted annotation", "", func(t *tenantSide, _ int) frSpec {
		return frSpec{annotations: `{` + lit(padKey) + `:` + lit(t.pad) + `}`}
	}),
	frCase("FencedResource leaseDurationSeconds 0", "", func(*tenantSide, int) frSpec { return frSpec{lease: "0"} }),
	frCase("FencedResource leaseDurationSeconds 3601", "", func(*tenantSide, int) frSpec { return frSpec{lease: "3601"} }),
	frCase("FencedResource resourceID of the honest lock", "", func(*tenantSide, int) frSpec {
		return frSpec{idLit: lit(soakHonestNS + "/" + soakLock)}
	}),
}

// shortID is a resourceID literal that fits beside any name.
func shortID(n int) string { return lit(fmt.Sprintf("odd/%d", n)) }

// owners is n distinct 252-byte identities, the tenant's first.
func owners(tenant string, n int) []string {
	out := []string{tenant}
	for i := 1; i < n; i++ {
		out = append(out, multibyte(124)+fmt.Sprintf("%03d", i)+"a")
	}
	return out
}

func (t *tenantSide) claimed() {
	t.mu.Lock()
	t.lastClaimAt = time.Now()
	t.mu.Unlock()
}

// odd sends the catalog again and again while the gate is open.
func (t *tenantSide) odd(ctx context.Context, g *gate) {
	for n := 1; g.wait(ctx) == nil; n++ {
		c := oddCases[(n-1)%len(oddCases)]
		t.oddOnce(ctx, c, n)
		if ctxtime.Sleep(ctx, 50*time.Millisecond) != nil {
			return
		}
	}
}

// oddOnce sends case c and follows what was admitted to its end.
func (t *tenantSide) oddOnce(ctx context.Context, c oddCase, n int) {
	t.mu.Lock()
	res := t.res.oddCase(c.name)
	t.mu.Unlock()
	name, body := c.build(t, n)
	resource := "lockgrants"
	if c.entry {
		resource = "fencedresources"
	}
	err := t.post(ctx, resource, body)
	if ctx.Err() != nil {
		return
	}
	t.mu.Lock()
	res.Attempts++
	if err != nil {
		res.Refused++
		if res.Refusal == "" {
			res.Refusal = shorten(err.Error(), 240)
		}
	} else {
		res.Admitted++
	}
	t.mu.Unlock()
	if err != nil {
		return
	}
	if !c.entry {
		t.remember(true, soakTenantNS, name)
		t.settle(ctx, res, name)
		t.deleteOdd(ctx, true, name)
		return
	}
	t.remember(false, soakTenantNS, name)
	t.requestEntry(ctx, res, name, c.category, n)
	t.deleteOdd(ctx, false, name)
}

// requestEntry asks for an admitted odd entry with a well-formed request.
func (t *tenantSide) requestEntry(ctx context.Context, res *oddCaseResult, entry, category string, n int) {
	lg := t.grant(soakTenantNS, entry, fmt.Sprintf("odd-%d", n))
	lg.Spec.OperationCategory = category
	if err := t.kube.Create(ctx, lg); err != nil {
		if ctx.Err() == nil {
			t.mu.Lock()
			res.Unservable++
			if res.UnservableWhy == "" {
				res.UnservableWhy = shorten(err.Error(), 240)
			}
			t.mu.Unlock()
		}
		return
	}
	t.remember(true, soakTenantNS, lg.Name)
	t.settle(ctx, res, lg.Name)
	t.deleteOdd(ctx, true, lg.Name)
}

// settle waits up to 20 s for LockGrant name to be served (the registry
// named it holder; the releaser then releases it) or Denied.
func (t *tenantSide) settle(ctx context.Context, res *oddCaseResult, name string) {
	deadline := time.Now().Add(20 * time.Second)
	outcome := &res.Stalled
	for time.Now().Before(deadline) {
		var lg locksv1.LockGrant
		err := t.kube.Get(ctx, types.NamespacedName{Namespace: soakTenantNS, Name: name}, &lg)
		if t.wasServed(name) || (err == nil && lg.Status.Phase != "" && lg.Status.Phase != locksv1.PhasePending && lg.Status.Phase != locksv1.PhaseDenied) {
			outcome = &res.Served
			break
		}
		if err == nil && lg.Status.Phase == locksv1.PhaseDenied {
			outcome = &res.Denied
			break
		}
		if ctxtime.Sleep(ctx, 200*time.Millisecond) != nil {
			return
		}
	}
	t.mu.Lock()
	*outcome++
	t.mu.Unlock()
}

func (t *tenantSide) deleteOdd(ctx context.Context, lockGrant bool, name string) {
	var obj client.Object = &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: soakTenantNS, Name: name}}
	if lockGrant {
		obj = &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: soakTenantNS, Name: name}}
	}
	if err := t.kube.Delete(ctx, obj); err == nil || apierrors.IsNotFound(err) {
		// A LockGrant is gone at once; cleanup waits for whatever is
		// still there.
		if !lockGrant {
			t.forget(false, soakTenantNS, name)
		}
	}
}

// post creates an object from raw JSON as the tenant; a refusal is the API
// server's message.
func (t *tenantSide) post(ctx context.Context, resource string, body []byte) error {
	url := strings.TrimSuffix(t.cfg.Host, "/") + "/apis/locks.fencekeeper.dev/v1alpha1/namespaces/" + soakTenantNS + "/" + resource
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusCreated || resp.StatusCode == http.StatusOK {
		return nil
	}
	var st metav1.Status
	if json.Unmarshal(raw, &st) == nil && st.Message != "" {
		return fmt.Errorf("%d: %s", resp.StatusCode, st.Message)
	}
	return fmt.Errorf("%d: %s", resp.StatusCode, shorten(string(raw), 200))
}

// garbage is one kind of unresolved-mutation record; literal is its JSON
// string literal, given the annotation budget in bytes.
type garbage struct {
	name    string
	literal func(budget int) string
}

func overdueRecord() string {
	b, _ := json.Marshal(locksv1.UnresolvedMutation{Object: "ConfigMap/" + soakData, Operation: "tenant", Fence: 1, Segment: 1,
		Payload: "sha256:" + strings.Repeat("0", 64), Since: time.Unix(0, 0).UTC()})
	return string(b)
}

var garbageRecords = []garbage{
	{"not JSON", func(int) string { return lit("{not json") }},
	{"overdue since 1970", func(int) string { return lit(overdueRecord()) }},
	{"since the year 9999", func(int) string {
		return lit(`{"object":"ConfigMap/x","operation":"o","fence":1,"segment":1,"payload":"sha256:00","since":"9999-12-31T23:59:59Z"}`)
	}},
	{"fence 1e400", func(int) string {
		return lit(`{"object":"ConfigMap/x","operation":"o","fence":1e400,"segment":1,"payload":"sha256:00","since":"1970-01-01T00:00:00Z"}`)
	}},
	{"50,000 nested arrays", func(int) string { return lit(strings.Repeat("[", 50000)) }},
	{`raw 0xff, \ud800 in and around`, func(int) string {
		return "\"{\\\"object\\\":\\\"\xff\\\\ud800\\\",\\\"since\\\":\\\"1970-01-01T00:00:00Z\\\"}\\ud800\""
	}},
	{"largest the budget allows", func(budget int) string {
		n := max(0, budget-len(locksv1.AnnotationUnresolvedMutation)-160)
		return lit(`{"object":"` + multibyte(n/2) + `","operation":"o","fence":1,"segment":1,"payload":"sha256:00","since":"1970-01-01T00:00:00Z"}`)
	}},
	{"1 MiB", func(int) string { return lit(strings.Repeat("x", 1<<20)) }},
}

// records puts garbage unresolved-mutation records on the tenant's own
// Pending grants (behind its anchor), one patch every 250 ms of hostile
// time, and creates two grants on the honest lock carrying an overdue one.
func (t *tenantSide) records(ctx context.Context, g *gate) {
	if g.wait(ctx) != nil {
		return
	}
	var names []string
	for i := 0; i < recordGrants; i++ {
		lg := t.grant(soakTenantNS, tenantRecords, fmt.Sprintf("rec-%d", i))
		if err := t.kube.Create(ctx, lg); err == nil {
			t.remember(true, soakTenantNS, lg.Name)
			names = append(names, lg.Name)
		}
	}
	for i := 0; i < 2; i++ {
		lg := t.grant(soakHonestNS, soakLock, fmt.Sprintf("rec-%d", i))
		lg.Annotations = map[string]string{locksv1.AnnotationUnresolvedMutation: overdueRecord()}
		err := t.kube.Create(ctx, lg)
		t.mu.Lock()
		t.res.RecordsOnHonest.count(err)
		t.mu.Unlock()
		if err == nil {
			t.remember(true, soakHonestNS, lg.Name)
		}
	}
	budget := t.res.Annotation.LargestAdmitted + len(padKey)
	j := 0
	paced(ctx, g, 250*time.Millisecond, func(ctx context.Context) {
		if len(names) == 0 {
			return
		}
		kind := garbageRecords[j%len(garbageRecords)]
		name := names[j%len(names)]
		j++
		body := `{"metadata":{"annotations":{"` + locksv1.AnnotationUnresolvedMutation + `":` + kind.literal(budget) + `}}}`
		err := t.kube.Patch(ctx, &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: soakTenantNS, Name: name}},
			client.RawPatch(types.MergePatchType, []byte(body)))
		if ctx.Err() != nil {
			return
		}
		t.mu.Lock()
		t.res.record(kind.name).count(err)
		t.mu.Unlock()
	})
}
