package fence

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
)

// encoding/json matches object keys case-insensitively and lets a later
// duplicate key override an earlier one, so {"FENCE":1,…} or a second
// "payload" would pass a struct decode. The annotations are security
// relevant and compared by value, so they are decoded member by member here:
// exact keys, each at most once, the required ones present, nothing after
// the value.

// members reads one JSON object from dec and returns its members' raw values.
func members(dec *json.Decoder, required, optional []string) (map[string]json.RawMessage, error) {
	if err := expectDelim(dec, '{'); err != nil {
		return nil, err
	}
	out := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string) // inside an object the decoder only yields string keys here
		if !slices.Contains(required, key) && !slices.Contains(optional, key) {
			return nil, fmt.Errorf("unknown member %q (member names are case-sensitive)", key)
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("duplicate member %q", key)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out[key] = v
	}
	if err := expectDelim(dec, '}'); err != nil {
		return nil, err
	}
	for _, k := range required {
		if _, ok := out[k]; !ok {
			return nil, fmt.Errorf("missing member %q", k)
		}
	}
	return out, nil
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return fmt.Errorf("expected %q, found %v", want, tok)
	}
	return nil
}

// expectEnd fails unless dec has nothing left but whitespace.
func expectEnd(dec *json.Decoder) error {
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

func newDecoder(s string) *json.Decoder {
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	return dec
}

// jsonString decodes a JSON string; null is not a string.
func jsonString(name string, raw json.RawMessage) (string, error) {
	var s string
	if len(raw) == 0 || raw[0] != '"' {
		return "", fmt.Errorf("%s must be a JSON string, got %s", name, raw)
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("%s: %v", name, err)
	}
	return s, nil
}

// positiveInt decodes a bare positive integer literal (no sign, fraction or exponent).
func positiveInt(name string, raw json.RawMessage) (int64, error) {
	v, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || v < 1 {
		return 0, fmt.Errorf("%s %s is not a positive int64", name, raw)
	}
	return v, nil
}
