package lazylog_test

import (
	"bytes"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	crzap "sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/fencekeeper/fencekeeper/internal/lazylog"
)

// counted is a field value that counts how often it is encoded.
type counted struct {
	mu sync.Mutex
	n  int
}

func (c *counted) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	enc.AddString("k", "v")
	return nil
}

func (c *counted) times() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func newLogger(buf *bytes.Buffer, lazy bool) *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "" // comparable output
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(buf), zapcore.InfoLevel)
	if lazy {
		return zap.New(core, zap.WrapCore(lazylog.Wrap))
	}
	return zap.New(core)
}

// The same calls write the same lines, wrapped or not: fields in order,
// through chains of With and Named, from siblings that share a parent.
func TestSameOutput(t *testing.T) {
	run := func(lazy bool) string {
		var buf bytes.Buffer
		root := newLogger(&buf, lazy)
		parent := root.Named("issuer").With(zap.String("controller", "grant-issuer"))
		a := parent.With(zap.String("name", "a"), zap.Int("n", 1))
		b := parent.With(zap.String("name", "b")).Named("writer").With(zap.Bool("retry", true))
		a.Info("decided", zap.String("verdict", "HELD"))
		b.Info("wrote")
		a.Debug("not written")
		parent.Warn("plain")
		b.With().Error("no new fields", zap.Error(bytes.ErrTooLarge))
		root.Info("root")
		return buf.String()
	}
	eager, lazy := run(false), run(true)
	if eager != lazy {
		t.Fatalf("wrapped output differs:\n--- eager\n%s--- lazy\n%s", eager, lazy)
	}
	if n := bytes.Count([]byte(lazy), []byte("\n")); n != 5 {
		t.Fatalf("%d lines written, want 5:\n%s", n, lazy)
	}
}

// A logger's fields are encoded only when it writes, and once.
func TestEncodedOnlyWhenWritten(t *testing.T) {
	for _, lazy := range []bool{false, true} {
		var buf bytes.Buffer
		var c counted
		l := newLogger(&buf, lazy).With(zap.Object("obj", &c))
		l.Debug("below the level")
		before := c.times()
		l.Info("one")
		l.Info("two")
		switch {
		case lazy && (before != 0 || c.times() != 1):
			t.Errorf("lazy: encoded %d times before anything was written and %d after two entries, want 0 and 1", before, c.times())
		case !lazy && before != 1:
			t.Errorf("eager: encoded %d times by With, want 1 (the baseline this package removes)", before)
		}
	}
}

// Loggers made from one parent write at once without a race (go test -race).
func TestConcurrentWriters(t *testing.T) {
	var buf syncBuffer
	enc := zap.NewProductionEncoderConfig()
	root := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), &buf, zapcore.InfoLevel), zap.WrapCore(lazylog.Wrap))
	parent := root.With(zap.String("controller", "x"))
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			l := parent.With(zap.Int("worker", i))
			for range 50 {
				l.Info("entry")
				parent.Info("shared")
			}
		})
	}
	wg.Wait()
	if n := bytes.Count(buf.bytes(), []byte("\n")); n != 800 {
		t.Fatalf("%d lines, want 800", n)
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) Sync() error { return nil }

func (s *syncBuffer) bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.buf.Bytes())
}

var stack = regexp.MustCompile(`,"stacktrace":"[^"]*"`)

// As cmd/manager builds it: controller-runtime's logger (its Kubernetes-aware
// encoder and production sampling) through logr, wrapped or not, writes the
// same lines.
func TestControllerRuntimeLogger(t *testing.T) {
	run := func(lazy bool) string {
		var buf bytes.Buffer
		// One time for every entry: the two runs may straddle a second.
		sameTime := func(o *crzap.Options) {
			o.TimeEncoder = func(_ time.Time, enc zapcore.PrimitiveArrayEncoder) { enc.AppendString("T") }
		}
		opts := []crzap.Opts{crzap.WriteTo(&buf), sameTime}
		if lazy {
			opts = append(opts, crzap.RawZapOpts(zap.WrapCore(lazylog.Wrap)))
		}
		log := crzap.New(opts...)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "orders"}}
		r := log.WithName("grant-issuer").WithValues("controller", "grant-issuer", "object", cm)
		r.WithValues("reconcileID", "42").Info("decided", "fence", 7)
		r.V(1).Info("below the level")
		r.Error(bytes.ErrTooLarge, "write failed", "configmap", cm)
		// The stack (its line numbers) differs between the runs.
		return stack.ReplaceAllString(buf.String(), "")
	}
	eager, lazy := run(false), run(true)
	if eager != lazy {
		t.Fatalf("wrapped output differs:\n--- eager\n%s--- lazy\n%s", eager, lazy)
	}
	if !strings.Contains(lazy, `"configmap":{"namespace":"team-a","name":"orders"}`) || !strings.Contains(lazy, `"ts":"T"`) || strings.Count(lazy, "\n") != 2 {
		t.Fatalf("unexpected output:\n%s", lazy)
	}
}

// The logger reports the base's level, below Debug included.
func TestLevel(t *testing.T) {
	level := zap.NewAtomicLevelAt(zapcore.Level(-5))
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&bytes.Buffer{}), level)
	eager, lazy := zap.New(core), zap.New(core, zap.WrapCore(lazylog.Wrap))
	if eager.Level() != lazy.Level() || lazy.With(zap.Int("n", 1)).Level() != zapcore.Level(-5) {
		t.Fatalf("level %v wrapped, %v with a field, want %v", lazy.Level(), lazy.With(zap.Int("n", 1)).Level(), eager.Level())
	}
}

// A core used directly (as zapcore.NewTee does) writes with its fields and
// syncs its base.
func TestCoreUsedDirectly(t *testing.T) {
	var buf bytes.Buffer
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = ""
	core := lazylog.Wrap(zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(&buf), zapcore.InfoLevel))
	if core.With(nil) != core {
		t.Error("With without fields made a new core")
	}
	if err := core.With([]zapcore.Field{zap.String("k", "v")}).Write(zapcore.Entry{Level: zapcore.InfoLevel, Message: "m"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := core.Sync(); err != nil {
		t.Fatal(err)
	}
	if want := `{"level":"info","msg":"m","k":"v"}` + "\n"; buf.String() != want {
		t.Fatalf("wrote %q, want %q", buf.String(), want)
	}
}
