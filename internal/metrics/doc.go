// Package metrics is fencelock's OpenTelemetry instrumentation: the instruments, their
// attribute sets built once, one set of instruments per meter provider, and the default
// provider of the constructors given none. The root package is its only user; its public face
// is fencelock.WithMeterProvider and fencelock.SetDefaultMeterProvider.
//
// # Narrow interface
//
// The package never sees a lock: callers name what a measurement is about with a [Method] and
// an [Outcome] (they classify their own errors), and feed the counts of what is held or
// waiting now with [Instruments.LeaseStarted], [Instruments.LeaseEnded],
// [Instruments.Queued] and [Instruments.Dequeued]. Those counts are atomics that the
// observable instruments' callback reads: a count is never recorded as deltas, which a
// provider that forwards only what comes after it is set up (OpenTelemetry's global one)
// would drive negative for a lease granted before and ended after. The package runs no SQL.
//
// Instrument names and units follow OpenTelemetry's semantic conventions (dotted lower-case
// names, durations in seconds as float histograms, counts without a unit). Attributes take a
// handful of values each (method, outcome, cause); lease and lock names are never
// attributes, since their number is unbounded. Every attribute set is built once, so a
// recording costs an atomic add or a histogram bucket update in the SDK, and nothing beyond
// an interface call with the no-op provider.
package metrics
