package fence

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// encoding/json matches object keys case-insensitively and lets a later
// duplicate key override an earlier one, so {"FENCE":1,…} or a second
// "payload" would pass a struct decode. The annotations are security
// relevant and compared by value, so they are decoded member by member here:
// exact keys, each at most once, the required ones present, nothing after
// the value.
//
// The acceptance webhook parses the stored and the new receipt log (up to
// 32 entries) on every protected write, so this is on the write path: the
// document is checked once by json.Valid, and a scanner then only finds
// where each member and value ends, without allocating per token (a
// json.Decoder walking tokens cost ~2,600 allocations and ~0.24 ms per log).
// Strings with escapes or non-ASCII bytes are decoded by encoding/json.

// scanner walks one JSON document that json.Valid accepted.
type scanner struct {
	s string
	i int
}

// newScanner fails, naming the syntax error, unless s is one valid JSON value.
func newScanner(s string) (*scanner, error) {
	b := []byte(s)
	if !json.Valid(b) {
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, err
		}
		return nil, errors.New("invalid JSON")
	}
	return &scanner{s: s}, nil
}

func (sc *scanner) skipSpace() {
	for sc.i < len(sc.s) {
		switch sc.s[sc.i] {
		case ' ', '\t', '\n', '\r':
			sc.i++
		default:
			return
		}
	}
}

// expect consumes the delimiter want (after whitespace).
func (sc *scanner) expect(want byte) error {
	sc.skipSpace()
	if sc.i >= len(sc.s) {
		return fmt.Errorf("expected %q, found the end", want)
	}
	if c := sc.s[sc.i]; c != want {
		return fmt.Errorf("expected %q, found %q", want, c)
	}
	sc.i++
	return nil
}

// closes consumes end if it comes next: the container is empty.
func (sc *scanner) closes(end byte) bool {
	sc.skipSpace()
	if sc.i < len(sc.s) && sc.s[sc.i] == end {
		sc.i++
		return true
	}
	return false
}

// more consumes the ',' or end after a container's element and says
// whether another element follows.
func (sc *scanner) more(end byte) bool {
	sc.skipSpace()
	c := sc.s[sc.i]
	sc.i++
	return c != end
}

// end fails unless only whitespace is left.
func (sc *scanner) end() error {
	sc.skipSpace()
	if sc.i != len(sc.s) {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

// value returns the next value's raw text.
func (sc *scanner) value() string {
	sc.skipSpace()
	start := sc.i
	switch sc.s[sc.i] {
	case '"':
		sc.skipString()
	case '{', '[':
		for depth := 0; ; {
			switch sc.s[sc.i] {
			case '"':
				sc.skipString()
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			sc.i++
			if depth == 0 {
				break
			}
		}
	default: // number, true, false, null
		for sc.i < len(sc.s) && !strings.ContainsRune(",}] \t\n\r", rune(sc.s[sc.i])) {
			sc.i++
		}
	}
	return sc.s[start:sc.i]
}

// skipString moves past the string literal starting at sc.i.
func (sc *scanner) skipString() {
	for sc.i++; sc.s[sc.i] != '"'; sc.i++ {
		if sc.s[sc.i] == '\\' {
			sc.i++
		}
	}
	sc.i++
}

// members reads one JSON object and returns its members' raw values.
func (sc *scanner) members(required, optional []string) (map[string]string, error) {
	if err := sc.expect('{'); err != nil {
		return nil, err
	}
	out := make(map[string]string, len(required)+len(optional))
	for empty := sc.closes('}'); !empty; {
		key, err := jsonString("member name", sc.value())
		if err != nil {
			return nil, err
		}
		if !slices.Contains(required, key) && !slices.Contains(optional, key) {
			return nil, fmt.Errorf("unknown member %q (member names are case-sensitive)", key)
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("duplicate member %q", key)
		}
		if err := sc.expect(':'); err != nil {
			return nil, err
		}
		out[key] = sc.value()
		if !sc.more('}') {
			break
		}
	}
	for _, k := range required {
		if _, ok := out[k]; !ok {
			return nil, fmt.Errorf("missing member %q", k)
		}
	}
	return out, nil
}

// jsonString decodes a JSON string; null is not a string.
func jsonString(name, raw string) (string, error) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", fmt.Errorf("%s must be a JSON string, got %s", name, raw)
	}
	if inner := raw[1 : len(raw)-1]; !strings.ContainsRune(inner, '\\') && utf8.ValidString(inner) {
		return inner, nil // json.Valid has ruled out control characters
	}
	var s string
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		return "", fmt.Errorf("%s: %v", name, err)
	}
	return s, nil
}

// positiveInt decodes a bare positive integer literal (no sign, fraction or exponent).
func positiveInt(name, raw string) (int64, error) {
	v, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || v < 1 {
		return 0, fmt.Errorf("%s %s is not a positive int64", name, raw)
	}
	return v, nil
}
