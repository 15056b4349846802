package fence

import (
	"errors"
	"strings"
	"testing"
)

func TestParseEnvelopeStrictMembers(t *testing.T) {
	w := newWorld(t)
	good := w.envelope(w.grant("a", 1, rootOf('a')), 1, payload("x"))
	intent := strings.TrimSuffix(good, "}") + `,"intent":"delete"}`
	swap := func(s, old, with string) string {
		if !strings.Contains(s, old) {
			t.Fatalf("%q is not in %s", old, s)
		}
		return strings.Replace(s, old, with, 1)
	}
	for _, c := range []struct {
		name, s string
	}{
		{"upper-case member", swap(good, `"grant":`, `"Grant":`)},
		{"all-caps member", swap(good, `"segment":`, `"SEGMENT":`)},
		{"duplicate member", swap(good, `"proof":`, `"segment":2,"proof":`)},
		{"duplicate member spelled with an escape", swap(good, `"proof":`, `"p\u0061yload":"sha256:`+strings.Repeat("0", 64)+`","proof":`)},
		{"missing payload", swap(good, `,"payload":"`+payload("x")+`"`, ``)},
		{"missing proof", swap(good, `"proof":"`, `"x":"`)},
		{"proof null", swap(good, `"proof":"`, `"proof":null,"_":"`)},
		{"operation null", swap(good, `"operation":"op-a"`, `"operation":null`)},
		{"payload number", swap(good, `"payload":"`+payload("x")+`"`, `"payload":1`)},
		{"segment negative", swap(good, `"segment":1`, `"segment":-1`)},
		{"segment exponent", swap(good, `"segment":1`, `"segment":1e0`)},
		{"trailing object", good + "{}"},
		{"trailing garbage", good + "x"},
		{"an array", "[" + good + "]"},
		{"intent empty", strings.TrimSuffix(good, "}") + `,"intent":""}`},
		{"intent wrong case", strings.TrimSuffix(good, "}") + `,"intent":"Delete"}`},
		{"intent other value", strings.TrimSuffix(good, "}") + `,"intent":"update"}`},
		{"intent null", strings.TrimSuffix(good, "}") + `,"intent":null}`},
		{"intent true", strings.TrimSuffix(good, "}") + `,"intent":true}`},
		{"intent member upper-case", strings.TrimSuffix(good, "}") + `,"Intent":"delete"}`},
		{"intent twice", strings.TrimSuffix(intent, "}") + `,"intent":"delete"}`},
	} {
		if _, err := ParseEnvelope(c.s); err == nil || !errors.Is(err, ErrBadEnvelope) {
			t.Errorf("%s: got %v, want ErrBadEnvelope\n%s", c.name, err, c.s)
		}
	}

	for name, s := range map[string]string{"plain": good, "whitespace between members": strings.Replace(good, `,"proof":`, ` , "proof" : `, 1), "with intent": intent} {
		if _, err := ParseEnvelope(s); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	e, err := ParseEnvelope(intent)
	if err != nil || e.Intent != IntentDelete {
		t.Fatalf("intent: %+v %v", e, err)
	}
	// The intent is encoded after payload; without it the encoding is unchanged.
	if e.Encode() != intent || !strings.HasSuffix(e.Encode(), `","intent":"delete"}`) {
		t.Fatalf("encoding %s", e.Encode())
	}
	e.Intent = ""
	if e.Encode() != good {
		t.Fatalf("without intent %s", e.Encode())
	}
}

func TestParseReceiptsStrictMembers(t *testing.T) {
	r := Receipt{Fence: 2, Segment: 3, Operation: "op", Payload: payload("x"), Receipt: ReceiptDigest(resourceID, 2, rootOf('a'), 3, "op", payload("x"))}
	good := EncodeReceipts([]Receipt{r})
	swap := func(old, with string) string {
		if !strings.Contains(good, old) {
			t.Fatalf("%q is not in %s", old, good)
		}
		return strings.Replace(good, old, with, 1)
	}
	for _, c := range []struct{ name, s string }{
		{"upper-case member", swap(`"fence":`, `"FENCE":`)},
		{"capitalized member", swap(`"receipt":`, `"Receipt":`)},
		{"duplicate member", swap(`"segment":3`, `"segment":3,"segment":4`)},
		{"missing fence", swap(`"fence":2,`, ``)},
		{"missing receipt", swap(`,"receipt":"`+r.Receipt+`"`, ``)},
		{"empty entry", `[{}]`},
		{"null entry", `[null]`},
		{"operation null", swap(`"operation":"op"`, `"operation":null`)},
		{"fence zero", swap(`"fence":2`, `"fence":0`)},
		{"fence string", swap(`"fence":2`, `"fence":"2"`)},
		{"fence fraction", swap(`"fence":2`, `"fence":2.0`)},
		{"unknown member", swap(`"fence":2`, `"fence":2,"extra":0`)},
		{"trailing data", good + "[]"},
		{"trailing garbage", good + "]"},
		{"not an array", `{"fence":2}`},
		{"null", `null`},
	} {
		if _, err := ParseReceipts(c.s); err == nil {
			t.Errorf("%s: parsed\n%s", c.name, c.s)
		}
	}
	for _, s := range []string{good, "", "[]", " [ " + strings.Trim(good, "[]") + " ] "} {
		if _, err := ParseReceipts(s); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
}
