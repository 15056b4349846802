package main

import (
	"math"
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
