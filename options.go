package fencelock

import "log/slog"

// LessorOption configures a [Lessor]; [NewLessor] takes them. Each is validated by the
// constructor, which fails with an [*ArgumentError] on a bad one. An option that does not
// apply to a Lessor (an [AdvisoryOption]) does not compile there.
type LessorOption interface {
	applyLessor(*lessorConfig) error
}

// AdvisoryOption configures an [AdvisoryLocker]; [NewAdvisoryLocker] takes them. Each is
// validated by the constructor, which fails with an [*ArgumentError] on a bad one. An option
// that does not apply to an AdvisoryLocker (a [LessorOption]) does not compile there.
type AdvisoryOption interface {
	applyAdvisory(*advisoryConfig) error
}

// Option is an option that applies to both constructors: it is a [LessorOption] and an
// [AdvisoryOption] ([WithLogger]).
type Option interface {
	LessorOption
	AdvisoryOption
}

// commonConfig holds the settings that both constructors take.
type commonConfig struct {
	logger *slog.Logger
}

// Option implementations: one function type per configuration it sets.
type (
	lessorOption   func(*lessorConfig) error
	advisoryOption func(*advisoryConfig) error
	commonOption   func(*commonConfig) error
)

func (o lessorOption) applyLessor(c *lessorConfig) error       { return o(c) }
func (o advisoryOption) applyAdvisory(c *advisoryConfig) error { return o(c) }
func (o commonOption) applyLessor(c *lessorConfig) error       { return o(&c.common) }
func (o commonOption) applyAdvisory(c *advisoryConfig) error   { return o(&c.common) }

// applyAll applies opts in order to c; a nil option is refused.
func applyAll[O any](opts []O, apply func(O) error) error {
	for _, o := range opts {
		if any(o) == nil {
			return argError("option", "must not be nil")
		}
		if err := apply(o); err != nil {
			return err
		}
	}
	return nil
}

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
