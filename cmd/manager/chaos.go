//go:build chaos

package main

import (
	"flag"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/fencekeeper/fencekeeper/internal/operator"
)

// Flags only a test binary has (go build -tags chaos, test/chaos): the
// nemesis skews this operator's clock at run time through a file, and a
// broken-rule run turns the acceptance webhook's linearizable registry read
// into a cache read.
func init() {
	skewFile := flag.String("chaos-clock-skew-file", "", "TEST ONLY: a file holding a duration (e.g. 3s, -2s) added to the issuer's and webhook's clock; re-read every 100ms.")
	cached := flag.Bool("chaos-cached-registry-read", false, "TEST ONLY, UNSAFE: the acceptance webhook reads the registry from the informer cache.")
	applyChaosFlags = func(o *operator.Options) {
		o.RegistryReadFromCache = *cached
		if *skewFile != "" {
			c := &skewedClock{}
			go c.follow(*skewFile)
			o.Clock = c
		}
	}
}

// skewedClock is real time plus the duration last read from a file.
type skewedClock struct {
	clock.RealClock
	skew atomic.Int64
}

func (c *skewedClock) Now() time.Time                  { return time.Now().Add(time.Duration(c.skew.Load())) }
func (c *skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func (c *skewedClock) follow(path string) {
	for {
		if data, err := os.ReadFile(path); err == nil {
			if d, err := time.ParseDuration(strings.TrimSpace(string(data))); err == nil {
				c.skew.Store(int64(d))
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}
