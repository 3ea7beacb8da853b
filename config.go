package fencelock

import (
	"log/slog"

	imetrics "github.com/fencelock/fencelock/internal/metrics"
)

// What the configurations of a Lessor (lessor_options.go) and an AdvisoryLocker
// (advisory_options.go) share: the settings both take (a logger, and a recorder of metrics,
// whose recording methods are metrics.go's), and how options are applied.

// commonConfig holds the settings that both constructors take.
type commonConfig struct {
	logger  *slog.Logger
	metrics *metrics // nil until resolved: the default provider's
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

// metrics records on the instruments of one meter provider, taking the root's errors; its
// methods are safe for concurrent use.
type metrics struct{ in *imetrics.Instruments }

// defaultMetrics returns the recorder of the default meter provider: of the constructors given
// no [WithMeterProvider], and of the calls that take no lessor or locker ([FenceTx],
// [UpdateFencedTx]). A no-op provider until [SetDefaultMeterProvider].
func defaultMetrics() *metrics { return &metrics{imetrics.Default()} }
