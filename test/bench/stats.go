package main

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"sort"
	"time"
)

// dist summarises a latency sample (milliseconds in JSON).
type dist struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
	Mean float64 `json:"mean_ms"`
}

// summarize uses the nearest-rank percentile: p99 of 1,000 samples is the
// 990th smallest.
func summarize(samples []time.Duration) dist {
	if len(samples) == 0 {
		return dist{}
	}
	s := append([]time.Duration(nil), samples...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return ms(s[max(0, min(i, len(s)-1))])
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return dist{N: len(s), P50: rank(0.50), P90: rank(0.90), P99: rank(0.99), Max: ms(s[len(s)-1]), Mean: ms(sum / time.Duration(len(s)))}
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

func ratio(a, b float64) float64 {
	if b == 0 {
		return math.Inf(1)
	}
	return math.Round(a/b*100) / 100
}

// marshalFinite is json.MarshalIndent of a copy of v in which every float
// that is not finite (a ratio over no sample, a figure not measured) reads
// -1: JSON has no NaN or infinity, and one such figure must not cost the
// whole results file.
func marshalFinite(v any) ([]byte, error) {
	return json.MarshalIndent(deepCopyFinite(reflect.ValueOf(v)).Interface(), "", "  ")
}

var jsonMarshaler = reflect.TypeFor[json.Marshaler]()

// deepCopyFinite copies v, replacing non-finite floats by -1. A value that
// marshals itself (time.Time) is kept as it is.
func deepCopyFinite(v reflect.Value) reflect.Value {
	if v.Type().Implements(jsonMarshaler) || reflect.PointerTo(v.Type()).Implements(jsonMarshaler) {
		return v
	}
	switch v.Kind() {
	case reflect.Float32, reflect.Float64:
		out := reflect.New(v.Type()).Elem()
		f := v.Float()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			f = -1
		}
		out.SetFloat(f)
		return out
	case reflect.Pointer:
		if v.IsNil() {
			return v
		}
		out := reflect.New(v.Type().Elem())
		out.Elem().Set(deepCopyFinite(v.Elem()))
		return out
	case reflect.Struct:
		out := reflect.New(v.Type()).Elem()
		for i := range v.NumField() {
			switch f := v.Type().Field(i); {
			case out.Field(i).CanSet():
				out.Field(i).Set(deepCopyFinite(v.Field(i)))
			case f.Anonymous && f.Type.Kind() == reflect.Struct:
				// encoding/json writes the exported fields of an embedded
				// unexported struct; this copy cannot set them and would
				// write them as zeros.
				panic(fmt.Sprintf("marshalFinite: %s embeds the unexported %s: name the field", v.Type(), f.Type))
			}
		}
		return out
	case reflect.Slice:
		if v.IsNil() {
			return v
		}
		out := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
		for i := range v.Len() {
			out.Index(i).Set(deepCopyFinite(v.Index(i)))
		}
		return out
	case reflect.Map:
		if v.IsNil() {
			return v
		}
		out := reflect.MakeMapWithSize(v.Type(), v.Len())
		for it := v.MapRange(); it.Next(); {
			out.SetMapIndex(it.Key(), deepCopyFinite(it.Value()))
		}
		return out
	case reflect.Interface:
		if v.IsNil() {
			return v
		}
		out := reflect.New(v.Type()).Elem()
		out.Set(deepCopyFinite(v.Elem()))
		return out
	}
	return v
}
