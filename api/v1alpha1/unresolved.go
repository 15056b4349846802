package v1alpha1

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// MaxUnresolvedMutationBytes bounds an AnnotationUnresolvedMutation record.
// What pkg/lockclient writes is a few hundred bytes; the bound keeps the
// operator's cache and the condition message small whatever an owner writes.
const MaxUnresolvedMutationBytes = 4 << 10

// maxRecordObjectBytes bounds UnresolvedMutation.Object: a kind, a slash and
// an object name of at most 253 bytes.
const maxRecordObjectBytes = 512

// ErrBadUnresolvedMutation is returned for a value that is not an
// unresolved-mutation record.
var ErrBadUnresolvedMutation = errors.New("not an unresolved-mutation record")

// Encode renders the record as the annotation's value: compact JSON, checked
// as ParseUnresolvedMutation checks it, so what the client library writes is
// always what the LockGrant webhook admits.
func (u UnresolvedMutation) Encode() (string, error) {
	if err := u.validate(); err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadUnresolvedMutation, err)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // "<" stays one byte, not six
	if err := enc.Encode(u); err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadUnresolvedMutation, err)
	}
	s := strings.TrimSuffix(b.String(), "\n")
	if len(s) > MaxUnresolvedMutationBytes {
		return "", fmt.Errorf("%w: %d bytes, more than %d", ErrBadUnresolvedMutation, len(s), MaxUnresolvedMutationBytes)
	}
	return s, nil
}

// ParseUnresolvedMutation decodes an AnnotationUnresolvedMutation value
// strictly: at most MaxUnresolvedMutationBytes, one JSON object with only the
// members of UnresolvedMutation, each of them set and within its bounds,
// nothing after it. The LockGrant webhook refuses what it rejects; the
// operator ignores (and reports) what it rejects, since such a value never
// came from a write whose outcome a client could not determine.
func ParseUnresolvedMutation(raw string) (UnresolvedMutation, error) {
	if len(raw) > MaxUnresolvedMutationBytes {
		return UnresolvedMutation{}, fmt.Errorf("%w: %d bytes, more than %d", ErrBadUnresolvedMutation, len(raw), MaxUnresolvedMutationBytes)
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	var u UnresolvedMutation
	if err := dec.Decode(&u); err != nil {
		return UnresolvedMutation{}, fmt.Errorf("%w: %v", ErrBadUnresolvedMutation, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return UnresolvedMutation{}, fmt.Errorf("%w: data after the JSON object", ErrBadUnresolvedMutation)
	}
	if err := u.validate(); err != nil {
		return UnresolvedMutation{}, fmt.Errorf("%w: %v", ErrBadUnresolvedMutation, err)
	}
	return u, nil
}

// validate checks each member: every one is required (a missing member
// decodes as its zero value, which is never valid).
func (u UnresolvedMutation) validate() error {
	if _, name, ok := strings.Cut(u.Object, "/"); !ok || name == "" || len(u.Object) > maxRecordObjectBytes || !utf8.ValidString(u.Object) {
		return fmt.Errorf("object must be Kind/name, at most %d bytes of UTF-8, got %d bytes", maxRecordObjectBytes, len(u.Object))
	}
	if u.Operation == "" || len(u.Operation) > fence.MaxOperationBytes {
		return fmt.Errorf("operation must be 1..%d bytes, got %d", fence.MaxOperationBytes, len(u.Operation))
	}
	if u.Fence < 1 || u.Segment < 1 {
		return fmt.Errorf("fence and segment must be at least 1, got fence %d segment %d", u.Fence, u.Segment)
	}
	if !grant.IsDigest(u.Payload) {
		return fmt.Errorf("payload must be sha256:<64 hex digits>")
	}
	if u.Since.IsZero() {
		return fmt.Errorf("since must be the time the outcome became unknown")
	}
	return nil
}
