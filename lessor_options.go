package fencelock

import (
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/fencelock/fencelock/internal/timing"
)

// LessorOption configures a [Lessor]; [NewLessor] takes them. Each is validated by the
// constructor, which fails with an [*ArgumentError] on a bad one. An option that does not
// apply to a Lessor (an [AdvisoryOption]) does not compile there. An option is an immutable
// value: one may be passed to any number of constructors, from any goroutine.
type LessorOption interface {
	applyLessor(*lessorConfig) error
}

// lessorOption is a [LessorOption] that sets the lessor's own configuration.
type lessorOption func(*lessorConfig) error

func (o lessorOption) applyLessor(c *lessorConfig) error { return o(c) }

// span is a duration given either as such or as a fraction of each lease's TTL.
type span struct {
	d       time.Duration // when perTTL is 0
	perTTL  int64         // > 0: the span is ttl / perTTL
	enabled bool          // false: none (a lessor without heartbeat)
}

// of returns the span for a lease of ttl.
func (s span) of(ttl time.Duration) time.Duration {
	switch {
	case !s.enabled:
		return 0
	case s.perTTL > 0:
		return ttl / time.Duration(s.perTTL)
	}
	return s.d
}

// leaseTimes are the durations of one lease (TTL, heartbeat, safety margin), resolved from its
// TTL and the lessor's options by lessorConfig.times; the schedule's functions are their
// methods (internal/timing).
type leaseTimes = timing.Times

// lessorConfig is a Lessor's configuration, every default resolved by newLessorConfig.
type lessorConfig struct {
	common    commonConfig
	holder    string
	heartbeat span // default ttl/3; disabled by WithoutHeartbeat
	margin    span // default ttl/10
	backoff   Backoff
	clock     timing.Clock

	heartbeatSet, noHeartbeat bool // for the conflict check only
}

// newLessorConfig applies opts over the defaults and checks that they agree.
func newLessorConfig(opts []LessorOption) (lessorConfig, error) {
	c := lessorConfig{
		heartbeat: span{perTTL: 3, enabled: true},
		margin:    span{perTTL: 10, enabled: true},
		clock:     timing.System{},
	}
	if err := applyAll(opts, func(o LessorOption) error { return o.applyLessor(&c) }); err != nil {
		return lessorConfig{}, err
	}
	if c.noHeartbeat && c.heartbeatSet {
		return lessorConfig{}, argError("WithoutHeartbeat", "conflicts with WithHeartbeatInterval")
	}
	if c.holder == "" {
		c.holder = defaultHolder()
	}
	if c.backoff == nil {
		c.backoff = ExponentialBackoff(5*time.Millisecond, 250*time.Millisecond)
	}
	c.common.resolve()
	return c, nil
}

// times resolves the durations of a lease of ttl, or says which setting does not fit it.
func (c lessorConfig) times(ttl time.Duration) (leaseTimes, error) {
	if err := validateTTL(ttl); err != nil {
		return leaseTimes{}, err
	}
	t := leaseTimes{TTL: ttl, Heartbeat: c.heartbeat.of(ttl), Margin: c.margin.of(ttl)}
	switch {
	case t.Margin >= ttl:
		return leaseTimes{}, argError("WithSafetyMargin", "is %v; it must be shorter than the ttl %v", t.Margin, ttl)
	case t.Heartbeat == 0:
	case t.Heartbeat >= ttl-t.Margin && !c.heartbeatSet:
		return leaseTimes{}, argError("WithSafetyMargin", "is %v; with the default heartbeat of ttl/3 it must be under 2/3 of the ttl %v", t.Margin, ttl)
	case t.Heartbeat >= ttl-t.Margin:
		return leaseTimes{}, argError("WithHeartbeatInterval", "is %v; it must be shorter than the ttl %v less the safety margin %v", t.Heartbeat, ttl, t.Margin)
	}
	return t, nil
}

// WithHolder sets the holder id stored with every grant of the lessor: 1 to [MaxNameLength]
// bytes of UTF-8 without NUL. It must be unique among live lessors: renew and release are
// scoped to (name, holder, token), and a holder id shared by two processes lets each release
// the other's grants after a cancelled acquire.
//
// Default: "<hostname>:<pid>:<random hex>".
func WithHolder(id string) LessorOption {
	return lessorOption(func(c *lessorConfig) error {
		if err := validateName("WithHolder", id); err != nil {
			return err
		}
		c.holder = id
		return nil
	})
}

// WithHeartbeatInterval sets how often a held lease is renewed, a positive time.Duration. Each
// acquire checks it against its TTL: it must be shorter than the TTL less the safety margin,
// or the acquire fails with an [*ArgumentError] before any SQL runs.
//
// Default: a third of each lease's TTL.
func WithHeartbeatInterval(d time.Duration) LessorOption {
	return lessorOption(func(c *lessorConfig) error {
		if d <= 0 {
			return argError("WithHeartbeatInterval", "is %v; it must be > 0", d)
		}
		c.heartbeat = span{d: d, enabled: true}
		c.heartbeatSet = true
		return nil
	})
}

// WithoutHeartbeat turns automatic renewal off: leases are renewed only by [Lease.Renew], and
// their Done channel still closes when the trust window ends. It conflicts with
// [WithHeartbeatInterval] ([*ArgumentError] from [NewLessor]).
//
// Default: renewal on (see [WithHeartbeatInterval]).
func WithoutHeartbeat() LessorOption {
	return lessorOption(func(c *lessorConfig) error {
		c.heartbeat = span{}
		c.noHeartbeat = true
		return nil
	})
}

// WithSafetyMargin sets how long before the end of its TTL a holder stops trusting a lease:
// the trust window of a grant or renewal ends at its send time (local monotonic clock) + TTL -
// margin. The margin covers clock-rate drift between client and server and the time between a
// trust check and the write it guards. It must be >= 0; each acquire checks that it is shorter
// than its TTL.
//
// Default: a tenth of each lease's TTL.
func WithSafetyMargin(d time.Duration) LessorOption {
	return lessorOption(func(c *lessorConfig) error {
		if d < 0 {
			return argError("WithSafetyMargin", "is %v; it must be >= 0", d)
		}
		c.margin = span{d: d, enabled: true}
		return nil
	})
}

// WithBackoff sets the wait between attempts of [Lessor.Acquire] and [Lessor.RunLocked] while
// the lease is held by someone else. The wait is also capped by the current holder's remaining
// TTL, so an expiring lease is retried when it expires. b must not be nil.
//
// Default: ExponentialBackoff(5*time.Millisecond, 250*time.Millisecond).
func WithBackoff(b Backoff) LessorOption {
	return lessorOption(func(c *lessorConfig) error {
		if b == nil {
			return argError("WithBackoff", "must not be nil")
		}
		c.backoff = b
		return nil
	})
}

func defaultHolder() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return host + ":" + strconv.Itoa(os.Getpid()) + ":" + strconv.FormatUint(rand.Uint64(), 16)
}
