// Package lazylog defers the encoding of a logger's context fields until
// something is logged.
//
// controller-runtime gives every reconcile and every admission request a
// logger with its own fields (the object's name and kind, a reconcile ID, the
// requesting user). zap encodes those fields when the logger is made, so every
// reconcile and webhook call pays for a JSON encoding that nothing reads
// unless the reconcile or the webhook logs, which on the hot path it does
// not: about 3 % of the operator's CPU in a contended handoff cycle. Wrap
// keeps the fields as they were given and encodes them only for an entry
// that is written.
//
// The price is zap's own (zapcore.NewLazyWith): a field holding a pointer is
// read when the entry is written, not when the logger was made.
package lazylog

import (
	"slices"
	"sync"

	"go.uber.org/zap/zapcore"
)

// Wrap returns a core whose With keeps the fields unencoded; pass it to
// zap.WrapCore.
func Wrap(base zapcore.Core) zapcore.Core { return &core{base: base} }

type core struct {
	base   zapcore.Core
	fields []zapcore.Field

	once sync.Once
	with zapcore.Core // base.With(fields), made for the first entry written
}

func (c *core) Enabled(l zapcore.Level) bool { return c.base.Enabled(l) }

// Level is the base's (zapcore.LevelOf), so zap.Logger.Level reports a
// verbosity below Debug (--zap-log-level=5) as the unwrapped core does.
func (c *core) Level() zapcore.Level { return zapcore.LevelOf(c.base) }

// With keeps fields with the ones given before, unencoded. Each core is
// never changed after it is made, so siblings share nothing mutable.
func (c *core) With(fields []zapcore.Field) zapcore.Core {
	if len(fields) == 0 {
		return c
	}
	return &core{base: c.base, fields: append(slices.Clip(c.fields), fields...)}
}

func (c *core) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if !c.base.Enabled(e.Level) {
		return ce
	}
	return c.encoded().Check(e, ce)
}

func (c *core) Write(e zapcore.Entry, fields []zapcore.Field) error {
	return c.encoded().Write(e, fields)
}

func (c *core) Sync() error { return c.base.Sync() }

func (c *core) encoded() zapcore.Core {
	c.once.Do(func() {
		c.with = c.base
		if len(c.fields) > 0 {
			c.with = c.base.With(c.fields)
		}
	})
	return c.with
}
