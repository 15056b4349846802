// Package fence is the acceptance point of fencekeeper: the rules that decide
// whether a mutation of a protected resource is accepted, given the fence
// state the resource already holds, the signed grant the caller presents, the
// caller's identity, the trust bundle and a linearizable view of the registry.
//
// It has no Kubernetes imports. DecideWrite decides a write to a protected
// object from plain inputs (its old and new marks, operation and
// subresource, the entry's facts, the registry read, the trust bundles):
// every verdict of the contract, which stored state to trust and the
// receipt-log check included. Decide, within it, applies the grant and fence
// rules in the contract's order; a store of another kind applies them too.
// The admission webhook gathers, calls DecideWrite and responds; the
// simulator drives that webhook, and the benchmarks call DecideWrite and
// Decide. The worker client decides nothing here: it builds what it sends
// with Stamp, and reads the stored state back (StateOf, ParseReceipts) to
// number its next segment and to resolve a write of unknown outcome.
package fence

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// Keys of the labels and annotations fencekeeper reads on protected objects.
const (
	LabelProtected     = "fencekeeper.dev/protected"
	AnnotationResource = "fencekeeper.dev/resource"
	AnnotationFence    = "fencekeeper.dev/fence"
	AnnotationReceipts = "fencekeeper.dev/receipts"
)

// MaxFenceAnnotationBytes bounds the fence annotation; larger is BAD_GRANT.
const MaxFenceAnnotationBytes = 8 << 10

// MaxReceipts is how many accepted segments the receipt log keeps (newest last).
const MaxReceipts = 32

// MaxOperationBytes bounds the operation ID.
const MaxOperationBytes = 253

// IntentDelete is the only valid Envelope.Intent: the segment declares that
// the holder is about to delete the object (docs/contract.md, "Deleting a protected object").
const IntentDelete = "delete"

// Envelope is the fencekeeper.dev/fence annotation: a signed grant plus the
// segment of the operation it authorizes and the digest of the new content.
type Envelope struct {
	Grant     grant.Grant `json:"grant"`
	Proof     string      `json:"proof"`
	Operation string      `json:"operation"`
	Segment   int64       `json:"segment"`
	Payload   string      `json:"payload"`
	// Intent is "" or IntentDelete. For a CREATE or UPDATE the segment is an
	// ordinary one; as the object's last accepted segment it lets the holder
	// of the same grant delete the object.
	Intent string `json:"intent,omitempty"`
}

// Receipt records one accepted segment.
type Receipt struct {
	Fence     int64  `json:"fence"`
	Segment   int64  `json:"segment"`
	Operation string `json:"operation"`
	Payload   string `json:"payload"`
	Receipt   string `json:"receipt"`
}

// ErrBadEnvelope is returned for an annotation that cannot be a valid envelope.
var ErrBadEnvelope = errors.New("bad fence annotation")

// Encode renders the envelope as compact JSON.
func (e *Envelope) Encode() string { return string(compact(e)) }

// ParseEnvelope decodes a fence annotation strictly: exactly the members of
// Envelope (case-sensitive, each once, intent optional), nothing after it.
// Everything wrong with it, including the grant's own shape, is reported as
// ErrBadEnvelope.
func ParseEnvelope(s string) (Envelope, error) {
	if len(s) > MaxFenceAnnotationBytes {
		return Envelope{}, fmt.Errorf("%w: %d bytes, limit %d", ErrBadEnvelope, len(s), MaxFenceAnnotationBytes)
	}
	e, err := parseEnvelope(s)
	if err != nil {
		return Envelope{}, fmt.Errorf("%w: %v", ErrBadEnvelope, err)
	}
	return e, nil
}

var (
	envelopeRequired = []string{"grant", "proof", "operation", "segment", "payload"}
	envelopeOptional = []string{"intent"}
)

func parseEnvelope(s string) (Envelope, error) {
	sc, err := newScanner(s)
	if err != nil {
		return Envelope{}, err
	}
	m, err := sc.members(envelopeRequired, envelopeOptional)
	if err != nil {
		return Envelope{}, err
	}
	if err := sc.end(); err != nil {
		return Envelope{}, err
	}
	var e Envelope
	if e.Grant, err = grant.Decode([]byte(m["grant"])); err != nil {
		return Envelope{}, fmt.Errorf("grant: %v", err)
	}
	if e.Segment, err = positiveInt("segment", m["segment"]); err != nil {
		return Envelope{}, err
	}
	if err := envelopeStrings(&e, m); err != nil {
		return Envelope{}, err
	}
	if raw, ok := m["intent"]; ok {
		// Present means declared: "" or any other spelling is not a default.
		if e.Intent, err = jsonString("intent", raw); err != nil || e.Intent != IntentDelete {
			return Envelope{}, fmt.Errorf("intent must be %q when present, got %s", IntentDelete, raw)
		}
	}
	return e, nil
}

// envelopeStrings decodes and checks operation, payload and proof.
func envelopeStrings(e *Envelope, m map[string]string) error {
	var err error
	if e.Operation, err = jsonString("operation", m["operation"]); err != nil {
		return err
	}
	if e.Operation == "" || len(e.Operation) > MaxOperationBytes {
		return fmt.Errorf("operation must be 1..%d bytes", MaxOperationBytes)
	}
	if e.Payload, err = jsonString("payload", m["payload"]); err != nil {
		return err
	}
	if !grant.IsDigest(e.Payload) {
		return fmt.Errorf("payload %q is not sha256:<64 hex digits>", e.Payload)
	}
	if e.Proof, err = jsonString("proof", m["proof"]); err != nil || e.Proof == "" {
		return fmt.Errorf("proof must be a non-empty string")
	}
	return nil
}

// ReceiptDigest is sha256 of "resourceID\nfence\noperationRoot\nsegment\noperation\npayload".
func ReceiptDigest(resourceID string, fence int64, root string, segment int64, operation, payload string) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\n%d\n%s\n%d\n%s\n%s", resourceID, fence, root, segment, operation, payload))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// EncodeReceipts renders a receipt log as compact JSON ("" for an empty log).
func EncodeReceipts(rs []Receipt) string {
	if len(rs) == 0 {
		return ""
	}
	return string(compact(rs))
}

// ParseReceipts decodes a receipt log ("" is the empty log) strictly: a JSON
// array of at most MaxReceipts entries, each with exactly the members of
// Receipt (case-sensitive, each once), nothing after it.
func ParseReceipts(s string) ([]Receipt, error) {
	if s == "" {
		return nil, nil
	}
	rs, err := parseReceipts(s)
	if err != nil {
		return nil, fmt.Errorf("receipt log: %v", err)
	}
	return rs, nil
}

var receiptMembers = []string{"fence", "segment", "operation", "payload", "receipt"}

func parseReceipts(s string) ([]Receipt, error) {
	sc, err := newScanner(s)
	if err != nil {
		return nil, err
	}
	if err := sc.expect('['); err != nil {
		return nil, err
	}
	var rs []Receipt
	for empty := sc.closes(']'); !empty; {
		if len(rs) == MaxReceipts {
			return nil, fmt.Errorf("more than %d entries", MaxReceipts)
		}
		m, err := sc.members(receiptMembers, nil)
		if err != nil {
			return nil, fmt.Errorf("entry %d: %v", len(rs), err)
		}
		r, err := receiptOf(m)
		if err != nil {
			return nil, fmt.Errorf("entry %d: %v", len(rs), err)
		}
		rs = append(rs, r)
		if !sc.more(']') {
			break
		}
	}
	return rs, sc.end()
}

func receiptOf(m map[string]string) (Receipt, error) {
	var r Receipt
	var err error
	if r.Fence, err = positiveInt("fence", m["fence"]); err != nil {
		return r, err
	}
	if r.Segment, err = positiveInt("segment", m["segment"]); err != nil {
		return r, err
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"operation", &r.Operation}, {"payload", &r.Payload}, {"receipt", &r.Receipt}} {
		if *f.dst, err = jsonString(f.name, m[f.name]); err != nil {
			return r, err
		}
	}
	return r, nil
}

// AppendReceipt returns log plus r, trimmed to the newest MaxReceipts.
func AppendReceipt(log []Receipt, r Receipt) []Receipt {
	out := append(append([]Receipt(nil), log...), r)
	if len(out) > MaxReceipts {
		out = out[len(out)-MaxReceipts:]
	}
	return out
}

// PayloadDigest is sha256:<hex> of the canonical JSON of v: compact, object
// keys sorted, no HTML escaping (encoding/json on map[string]any).
func PayloadDigest(v any) (string, error) {
	b, err := CanonicalJSON(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// CanonicalJSON encodes v as the payload encoding (docs/contract.md, "The payload digest").
func CanonicalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// ConfigMapPayload is the business content of a ConfigMap as the contract fixes
// it (docs/contract.md, "The payload digest"): {"binaryData":…,"data":…} with empty members left out.
func ConfigMapPayload(data map[string]string, binaryData map[string][]byte) map[string]any {
	p := map[string]any{}
	if len(data) > 0 {
		p["data"] = data
	}
	if len(binaryData) > 0 {
		p["binaryData"] = binaryData // encoding/json writes []byte as standard base64
	}
	return p
}

func compact(v any) []byte {
	b, err := CanonicalJSON(v)
	if err != nil {
		panic(err) // only fixed struct types reach here
	}
	return b
}

// Stamp prepares a fenced write: given the annotations of the object as read
// (they hold the stored receipt log), it sets the fence annotation to env and
// the receipt log to the stored log plus env's receipt. A stored log counts
// only under a stored fence annotation of the same resource, as the
// acceptance point counts it: a log planted without one starts over. The caller writes the
// object with these annotations and the content env.Payload digests, in one write.
func Stamp(annotations map[string]string, env Envelope) (Receipt, error) {
	if annotations == nil {
		return Receipt{}, fmt.Errorf("Stamp needs the object's annotations map (make one when it has none)")
	}
	g := env.Grant
	var stored []Receipt
	if boundTo(annotations[AnnotationFence], g.Resource) {
		var err error
		if stored, err = ParseReceipts(annotations[AnnotationReceipts]); err != nil {
			return Receipt{}, err
		}
	}
	r := Receipt{Fence: g.FenceToken, Segment: env.Segment, Operation: env.Operation, Payload: env.Payload,
		Receipt: ReceiptDigest(g.Resource, g.FenceToken, g.OperationRoot, env.Segment, env.Operation, env.Payload)}
	annotations[AnnotationFence] = env.Encode()
	annotations[AnnotationReceipts] = EncodeReceipts(AppendReceipt(stored, r))
	return r, nil
}

// boundTo reports whether a stored fence annotation is an envelope of resource.
func boundTo(fenceAnnotation, resource string) bool {
	if fenceAnnotation == "" {
		return false
	}
	e, err := ParseEnvelope(fenceAnnotation)
	return err == nil && e.Grant.Resource == resource
}
