package fencelock

import (
	"log/slog"

	"go.opentelemetry.io/otel/metric"

	imetrics "github.com/fencelock/fencelock/internal/metrics"
)

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

// WithMeterProvider sets the OpenTelemetry meter provider that fencelock's metrics are recorded
// on. mp must not be nil. It is an [Option]: it applies to [NewLessor] and [NewAdvisoryLocker].
//
// The instruments, under the instrumentation scope "github.com/fencelock/fencelock" (durations
// are float64 histograms in seconds; attributes take a few fixed values each, and lease and
// lock names are never attributes):
//   - fencelock.lease.acquire.duration: TryAcquire and Acquire calls, by fencelock.method
//     (try_acquire, acquire) and fencelock.outcome (granted, refused, canceled, error)
//   - fencelock.lease.grants: grants, by method (try_acquire, acquire, try_run_locked, run_locked)
//   - fencelock.lease.contended: calls that found the lease held (a try refused, a wait that
//     queued), by method; for try_acquire and acquire, contended divided by the count of
//     fencelock.lease.acquire.duration is the contention rate (RunLocked calls have no duration
//     histogram; a RunLocked that waits on the server's row lock, not in the queue, is not
//     counted as contended)
//   - fencelock.lease.hold.duration: from grant to end, by fencelock.cause (released, lost)
//   - fencelock.lease.held: leases held now, by the lessors on this provider (an observable
//     up-down counter: right whenever the provider was set)
//   - fencelock.lease.renewals: renewals by outcome (renewed; locked and failed, both retried;
//     lost)
//   - fencelock.lease.lost: leases lost, by cause (trust_window_expired, gone_on_server)
//   - fencelock.fence.stale_rejections: fenced writes rejected for a stale token, by method
//     (lease_fence_tx; fence_tx and update_fenced_tx, which take no lessor, record on the
//     default provider: [SetDefaultMeterProvider])
//   - fencelock.lease.queue.waiting: Acquire and RunLocked calls waiting in a queue now (a
//     RunLocked until its transaction has the row); observable, as held
//   - fencelock.advisory.acquire.duration: session advisory lock calls, by method (try_lock:
//     TryLock, whatever its options; lock: Lock) and outcome
//     (transaction locks are not measured)
//   - fencelock.advisory.sessions_lost: session locks lost because their session ended
//
// Outcomes: granted; refused (ErrNotAcquired, and a grant whose reply came after its trust
// window, released at once); canceled (ctx ended, whatever its cause); error. Lessors and
// lockers given one provider share its instruments. Each recording is an atomic add or a
// histogram update on an attribute set built once; with the no-op provider, an interface call.
// Measured (docs/PERFORMANCE.md): an uncontended TryAcquire and Release with a real SDK
// provider costs 1.00x the same with the no-op provider. The instruments of a provider are made
// once, on its first use, and kept, with a callback registered on it, for the life of the
// process: pass long-lived providers, not one per lessor.
//
// Default: the provider set by [SetDefaultMeterProvider] when the lessor or locker was made; a
// no-op provider until then. (Not OpenTelemetry's global provider: reading it would link
// OpenTelemetry's tracing, logging and propagation packages into every service that imports
// fencelock. Pass otel.GetMeterProvider() to use it.)
func WithMeterProvider(mp metric.MeterProvider) Option {
	return commonOption(func(c *commonConfig) error {
		if mp == nil {
			return argError("WithMeterProvider", "must not be nil")
		}
		c.metrics = metricsFor(mp)
		return nil
	})
}

// SetDefaultMeterProvider sets the meter provider of the lessors and advisory lockers made from
// now on without [WithMeterProvider], and of [FenceTx] and [UpdateFencedTx], which take no
// lessor (their stale-token rejections). Lessors and lockers made before keep the provider they
// were made with. mp must not be nil: an [*ArgumentError] otherwise, and nothing changes. Safe
// for concurrent use; call it at start-up, typically with otel.GetMeterProvider() once the
// application has set up OpenTelemetry.
//
// Default: a no-op provider.
func SetDefaultMeterProvider(mp metric.MeterProvider) error {
	if mp == nil {
		return argError("mp", "must not be nil")
	}
	imetrics.SetDefault(mp)
	return nil
}
