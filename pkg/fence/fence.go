// Package fence is the acceptance point of fencekeeper: the rules that decide
// whether a mutation of a protected resource is accepted, given the fence
// state the resource already holds, the signed grant the caller presents, the
// caller's identity, the trust bundle and a linearizable view of the registry.
//
// It has no Kubernetes imports. The admission webhook, the worker client, the
// simulator and any future database adapter all call Decide, so there is one
// implementation of the rules in DESIGN.md ("Fenced writes to protected
// objects"), in the order given there.
package fence

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

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

// maxOperationLen bounds the operation ID.
const maxOperationLen = 253

// Envelope is the fencekeeper.dev/fence annotation: a signed grant plus the
// segment of the operation it authorizes and the digest of the new content.
type Envelope struct {
	Grant     grant.Grant `json:"grant"`
	Proof     string      `json:"proof"`
	Operation string      `json:"operation"`
	Segment   int64       `json:"segment"`
	Payload   string      `json:"payload"`
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

// ParseEnvelope decodes a fence annotation strictly. Everything wrong with it,
// including the grant's own shape, is reported as ErrBadEnvelope.
func ParseEnvelope(s string) (Envelope, error) {
	var e Envelope
	if len(s) > MaxFenceAnnotationBytes {
		return e, fmt.Errorf("%w: %d bytes, limit %d", ErrBadEnvelope, len(s), MaxFenceAnnotationBytes)
	}
	var raw struct {
		Grant     json.RawMessage `json:"grant"`
		Proof     string          `json:"proof"`
		Operation string          `json:"operation"`
		Segment   json.RawMessage `json:"segment"`
		Payload   string          `json:"payload"`
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return e, fmt.Errorf("%w: %v", ErrBadEnvelope, err)
	}
	if dec.More() {
		return e, fmt.Errorf("%w: trailing data", ErrBadEnvelope)
	}
	g, err := grant.Decode(raw.Grant)
	if err != nil {
		return e, fmt.Errorf("%w: grant: %v", ErrBadEnvelope, err)
	}
	seg, err := strconv.ParseInt(string(raw.Segment), 10, 64) // a bare integer literal only
	if err != nil || seg < 1 {
		return e, fmt.Errorf("%w: segment %q is not a positive int64", ErrBadEnvelope, raw.Segment)
	}
	if raw.Operation == "" || len(raw.Operation) > maxOperationLen {
		return e, fmt.Errorf("%w: operation must be 1..%d bytes", ErrBadEnvelope, maxOperationLen)
	}
	if !grant.IsDigest(raw.Payload) {
		return e, fmt.Errorf("%w: payload %q is not sha256:<64 hex digits>", ErrBadEnvelope, raw.Payload)
	}
	if raw.Proof == "" {
		return e, fmt.Errorf("%w: proof is empty", ErrBadEnvelope)
	}
	return Envelope{Grant: g, Proof: raw.Proof, Operation: raw.Operation, Segment: seg, Payload: raw.Payload}, nil
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

// ParseReceipts decodes a receipt log ("" is the empty log).
func ParseReceipts(s string) ([]Receipt, error) {
	if s == "" {
		return nil, nil
	}
	var rs []Receipt
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rs); err != nil {
		return nil, fmt.Errorf("receipt log: %v", err)
	}
	if len(rs) > MaxReceipts {
		return nil, fmt.Errorf("receipt log has %d entries, limit %d", len(rs), MaxReceipts)
	}
	return rs, nil
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

// CanonicalJSON encodes v as DESIGN.md's payload encoding.
func CanonicalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// ConfigMapPayload is the business content of a ConfigMap as DESIGN.md fixes
// it: {"binaryData":…,"data":…} with empty members left out.
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
