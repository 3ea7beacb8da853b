package fencelock

import "log/slog"

// Option is an option that applies to both constructors: it is a [LessorOption] and an
// [AdvisoryOption] ([WithLogger]). Like them it is an immutable value, safe to share.
type Option interface {
	LessorOption
	AdvisoryOption
}

// commonOption is an [Option]: it sets the settings both configurations share.
type commonOption func(*commonConfig) error

func (o commonOption) applyLessor(c *lessorConfig) error     { return o(&c.common) }
func (o commonOption) applyAdvisory(c *advisoryConfig) error { return o(&c.common) }

// WithLogger sets the logger for renewal failures (Warn) and lost leases and locks (Error).
// Loss is also always signalled through Done and Err; logging is never the only signal.
// l must not be nil. It is an [Option]: it applies to [NewLessor] and [NewAdvisoryLocker].
//
// Default: a logger that discards everything.
func WithLogger(l *slog.Logger) Option {
	return commonOption(func(c *commonConfig) error {
		if l == nil {
			return argError("WithLogger", "must not be nil")
		}
		c.logger = l
		return nil
	})
}
