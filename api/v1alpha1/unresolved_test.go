package v1alpha1

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func validRecord() UnresolvedMutation {
	return UnresolvedMutation{Object: "ConfigMap/batch", Operation: "settle", Fence: 3, Segment: 2,
		Payload: "sha256:" + strings.Repeat("ab", 32), Since: time.Date(2026, 7, 19, 12, 0, 0, 0, time.UTC)}
}

func TestUnresolvedMutationRoundTrip(t *testing.T) {
	for name, u := range map[string]UnresolvedMutation{
		"plain":     validRecord(),
		"no kind":   func() UnresolvedMutation { u := validRecord(); u.Object = "/batch"; return u }(),
		"html-like": func() UnresolvedMutation { u := validRecord(); u.Operation = "<a&b>"; return u }(),
		"longest": func() UnresolvedMutation {
			u := validRecord()
			u.Object, u.Operation = strings.Repeat("K", 63)+"/"+strings.Repeat("n", 253), strings.Repeat("o", 253)
			return u
		}(),
	} {
		raw, err := u.Encode()
		if err != nil {
			t.Fatalf("%s: Encode: %v", name, err)
		}
		got, err := ParseUnresolvedMutation(raw)
		if err != nil || !got.Since.Equal(u.Since) {
			t.Fatalf("%s: Parse(%s) = %+v, %v", name, raw, got, err)
		}
		got.Since = u.Since
		if got != u {
			t.Errorf("%s: round trip %+v, want %+v", name, got, u)
		}
	}
}

func TestParseUnresolvedMutationRefusesGarbage(t *testing.T) {
	valid, err := validRecord().Encode()
	if err != nil {
		t.Fatal(err)
	}
	with := func(from, to string) string { return strings.Replace(valid, from, to, 1) }
	for name, c := range map[string]struct{ raw, says string }{
		"empty":            {"", "EOF"},
		"not JSON":         {"{not json", "invalid character"},
		"null":             {"null", "object must be Kind/name"},
		"array":            {"[]", "cannot unmarshal array"},
		"fields missing":   {`{"object":"ConfigMap/x"}`, "operation must be 1..253 bytes"},
		"unknown member":   {with(`{`, `{"note":"x",`), `unknown field "note"`},
		"trailing data":    {valid + "{}", "data after the JSON object"},
		"object no name":   {with(`"ConfigMap/batch"`, `"ConfigMap/"`), "object must be Kind/name"},
		"object no slash":  {with(`"ConfigMap/batch"`, `"batch"`), "object must be Kind/name"},
		"operation long":   {with(`"settle"`, `"`+strings.Repeat("o", 254)+`"`), "operation must be 1..253 bytes, got 254"},
		"fence zero":       {with(`"fence":3`, `"fence":0`), "fence and segment must be at least 1"},
		"segment negative": {with(`"segment":2`, `"segment":-1`), "fence and segment must be at least 1"},
		"fence a string":   {with(`"fence":3`, `"fence":"3"`), "cannot unmarshal string"},
		"payload":          {with(`"sha256:`, `"md5:`), "payload must be sha256:<64 hex digits>"},
		"since missing":    {with(`"since":"2026-07-19T12:00:00Z"`, `"since":"0001-01-01T00:00:00Z"`), "since must be"},
		"over the bound":   {with(`"settle"`, `"`+strings.Repeat(" ", 4<<10)+`"`), "more than 4096"},
	} {
		_, err := ParseUnresolvedMutation(c.raw)
		if !errors.Is(err, ErrBadUnresolvedMutation) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: Parse(%.80q) = %v, want an error saying %q", name, c.raw, err, c.says)
		}
	}
}

func TestEncodeRefusesWhatParseRefuses(t *testing.T) {
	u := validRecord()
	u.Fence = 0
	if _, err := u.Encode(); !errors.Is(err, ErrBadUnresolvedMutation) {
		t.Errorf("Encode of fence 0 = %v, want ErrBadUnresolvedMutation", err)
	}
}
