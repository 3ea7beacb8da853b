package fencelock

import "log/slog"

// What the configurations of a Lessor (lessor_options.go) and an AdvisoryLocker
// (advisory_options.go) share: the settings both take, and how options are applied.

// commonConfig holds the settings that both constructors take.
type commonConfig struct {
	logger  *slog.Logger
	metrics *metrics // nil until resolved: the default provider's (metrics.go)
}

// resolve fills in the defaults of the settings both configurations share.
func (c *commonConfig) resolve() {
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	if c.metrics == nil {
		c.metrics = defaultMetrics()
	}
}

// applyAll calls apply on each of opts, in order, and stops at the first error; a nil option
// is refused with an ArgumentError.
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
