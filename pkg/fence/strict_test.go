package fence

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// The scanner replaced a json.Decoder walking tokens (member by member,
// RawMessage values). That walk is kept here as the reference: both must
// accept exactly the same documents and return the same values.

func refMembers(dec *json.Decoder, required, optional []string) (map[string]string, error) {
	if err := refDelim(dec, '{'); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		if !slices.Contains(required, key) && !slices.Contains(optional, key) {
			return nil, fmt.Errorf("unknown member %q", key)
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("duplicate member %q", key)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out[key] = string(v)
	}
	if err := refDelim(dec, '}'); err != nil {
		return nil, err
	}
	for _, k := range required {
		if _, ok := out[k]; !ok {
			return nil, fmt.Errorf("missing member %q", k)
		}
	}
	return out, nil
}

func refDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return fmt.Errorf("expected %q, found %v", want, tok)
	}
	return nil
}

func refEnd(dec *json.Decoder) error {
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data")
	}
	return nil
}

func refParseReceipts(s string) ([]Receipt, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	if err := refDelim(dec, '['); err != nil {
		return nil, err
	}
	var rs []Receipt
	for dec.More() {
		if len(rs) == MaxReceipts {
			return nil, errors.New("too many")
		}
		m, err := refMembers(dec, receiptMembers, nil)
		if err != nil {
			return nil, err
		}
		r, err := receiptOf(m)
		if err != nil {
			return nil, err
		}
		rs = append(rs, r)
	}
	if err := refDelim(dec, ']'); err != nil {
		return nil, err
	}
	return rs, refEnd(dec)
}

// refEnvelopeMembers is the reference for the envelope's member split (the
// values are then decoded by the same functions).
func refEnvelopeMembers(s string) (map[string]string, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	m, err := refMembers(dec, envelopeRequired, envelopeOptional)
	if err != nil {
		return nil, err
	}
	return m, refEnd(dec)
}

func scanEnvelopeMembers(s string) (map[string]string, error) {
	sc, err := newScanner(s)
	if err != nil {
		return nil, err
	}
	m, err := sc.members(envelopeRequired, envelopeOptional)
	if err != nil {
		return nil, err
	}
	return m, sc.end()
}

var strictSeeds = []string{
	``, ` `, `null`, `[]`, ` [ ] `, `[ ]x`, `{}`, `[{}]`, `[{},]`, `[,]`, `[1]`, `[[]]`, `[null]`, `"x"`, `[`, `]`,
	`[{"fence":1,"segment":2,"operation":"op","payload":"p","receipt":"r"}]`,
	` [ { "fence" : 1 , "segment" : 2 , "operation" : "op" , "payload" : "p" , "receipt" : "r" } ] `,
	"[{\"fence\":1,\"segment\":2,\"operation\":\"o\\u0070\",\"payload\":\"p\\\"\\\\\",\"receipt\":\"\xff\"}]",
	`[{"fence":1,"segment":2,"operation":"é","payload":"p","receipt":"r"}]`,
	`[{"fen\u0063e":1,"segment":2,"operation":"op","payload":"p","receipt":"r"}]`,
	`[{"fence":1,"segment":2,"operation":"op","payload":"p","receipt":"r","fence":1}]`,
	`[{"FENCE":1,"segment":2,"operation":"op","payload":"p","receipt":"r"}]`,
	`[{"fence":01,"segment":2,"operation":"op","payload":"p","receipt":"r"}]`,
	`[{"fence":1.0,"segment":2,"operation":"op","payload":"p","receipt":"r"}]`,
	`[{"fence":-1,"segment":2,"operation":"op","payload":"p","receipt":"r"}]`,
	`[{"fence":1e2,"segment":2,"operation":"op","payload":"p","receipt":"r"}]`,
	`[{"fence":1,"segment":2,"operation":null,"payload":"p","receipt":"r"}]`,
	`[{"fence":1,"segment":2,"operation":{"a":[1,"]"]},"payload":"p","receipt":"r"}]`,
	`[{"fence":1,"segment":2,"operation":"op","payload":"p","receipt":"r"}] []`,
	`[{"fence":1,"segment":2,"operation":"op","payload":"p"}]`,
	`{"grant":{"a":"}"},"proof":"x","operation":"o","segment":1,"payload":"p","intent":"delete"}`,
	`{"grant":1,"proof":"x","operation":"o","segment":1,"payload":"p"} `,
	`{"grant":[],"proof":"x","operation":"o","segment":1,"payload":"p","Intent":"delete"}`,
	`{"grant":true,"proof":"x\"","operation":"o","segment":1,"payload":"p","grant":2}`,
}

func checkSameAsReference(t *testing.T, s string) {
	t.Helper()
	got, err := parseReceipts(s)
	want, refErr := refParseReceipts(s)
	if (err == nil) != (refErr == nil) || (err == nil && !reflect.DeepEqual(got, want)) {
		t.Fatalf("receipts %q: scanner %v, %v; reference %v, %v", s, got, err, want, refErr)
	}
	gotM, err := scanEnvelopeMembers(s)
	wantM, refErr := refEnvelopeMembers(s)
	if (err == nil) != (refErr == nil) || (err == nil && !reflect.DeepEqual(gotM, wantM)) {
		t.Fatalf("envelope members %q: scanner %v, %v; reference %v, %v", s, gotM, err, wantM, refErr)
	}
}

func TestScannerMatchesReference(t *testing.T) {
	var log []Receipt
	for i := range int64(MaxReceipts + 1) {
		log = append(log, Receipt{Fence: 3, Segment: i + 1, Operation: "op", Payload: "sha256:" + strings.Repeat("a", 64), Receipt: "r"})
	}
	seeds := append(slices.Clone(strictSeeds), EncodeReceipts(log[:MaxReceipts]), EncodeReceipts(log))
	for _, s := range seeds {
		checkSameAsReference(t, s)
	}
}

// FuzzScannerMatchesReference: on any input, the scanner and the token walk
// agree on acceptance and on every value.
func FuzzScannerMatchesReference(f *testing.F) {
	for _, s := range strictSeeds {
		f.Add(s)
	}
	f.Fuzz(checkSameAsReference)
}

// An unquoted byte sequence is never valid JSON, so the scanner's error names the syntax error.
func TestScannerNamesSyntaxError(t *testing.T) {
	_, err := ParseReceipts(`[{"fence":1,}]`)
	if err == nil || !strings.Contains(err.Error(), "invalid character") {
		t.Fatalf("want the syntax error, got %v", err)
	}
	if _, err := newScanner(string(bytes.Repeat([]byte("["), 3))); err == nil {
		t.Fatal("unterminated arrays accepted")
	}
}
