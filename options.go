package fencelock

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"time"
)

// Option configures a [Lessor] or an [AdvisoryLocker]. Options are validated by the
// constructor, which fails with an [*ArgumentError] on a bad one, or on one that does not
// apply to what it builds (each option's doc says which it applies to).
type Option func(*config) error

type config struct {
	set map[string]bool // options applied, by name, for the applicability check

	// Lessor
	holder      string
	heartbeat   time.Duration // 0: ttl/3
	noHeartbeat bool
	margin      time.Duration // -1: ttl/10
	backoff     Backoff

	// AdvisoryLocker
	namespace string
	keyHash   KeyHash
	watchdog  time.Duration
	maxHeld   int
	tokens    bool

	// both
	logger *slog.Logger
}

// Which options apply to which constructor.
var (
	lessorOnly   = []string{"WithHolder", "WithHeartbeatInterval", "WithoutHeartbeat", "WithSafetyMargin", "WithBackoff"}
	advisoryOnly = []string{"WithNamespace", "WithKeyHash", "WithWatchdogInterval", "WithMaxHeld", "WithFencingTokens"}
)

// apply runs opts on a fresh config and refuses the options named in notFor, which do not
// apply to what forWhat is building.
func applyOptions(forWhat string, notFor []string, opts []Option) (config, error) {
	c := config{margin: -1, set: map[string]bool{}}
	for _, o := range opts {
		if o == nil {
			return config{}, argError("option", "must not be nil")
		}
		if err := o(&c); err != nil {
			return config{}, err
		}
	}
	for _, name := range notFor {
		if c.set[name] {
			return config{}, argError(name, "does not apply to %s", forWhat)
		}
	}
	return c, nil
}

// WithHolder sets the holder id stored with every grant of the lessor: 1 to [MaxNameLength]
// bytes of UTF-8 without NUL. It must be unique among live lessors: renew and release are
// scoped to (name, holder, token), and a holder id shared by two processes lets each release
// the other's grants after a cancelled acquire.
//
// Default: "<hostname>:<pid>:<random hex>".
//
// Applies to [NewLessor] only.
func WithHolder(id string) Option {
	return func(c *config) error {
		c.set["WithHolder"] = true
		if err := validateName("WithHolder", id); err != nil {
			return err
		}
		c.holder = id
		return nil
	}
}

// WithHeartbeatInterval sets how often a held lease is renewed, a positive time.Duration. Each
// acquire checks it against its TTL: it must be shorter than the TTL less the safety margin,
// or the acquire fails with an [*ArgumentError] before any SQL runs.
//
// Default: a third of each lease's TTL.
//
// Applies to [NewLessor] only.
func WithHeartbeatInterval(d time.Duration) Option {
	return func(c *config) error {
		c.set["WithHeartbeatInterval"] = true
		if d <= 0 {
			return argError("WithHeartbeatInterval", "is %v; it must be > 0", d)
		}
		c.heartbeat = d
		return nil
	}
}

// WithoutHeartbeat turns automatic renewal off: leases are renewed only by [Lease.Renew], and
// their Done channel still closes when the trust window ends.
//
// Default: renewal on (see [WithHeartbeatInterval]).
//
// Applies to [NewLessor] only.
func WithoutHeartbeat() Option {
	return func(c *config) error {
		c.set["WithoutHeartbeat"] = true
		c.noHeartbeat = true
		return nil
	}
}

// WithSafetyMargin sets how long before the end of its TTL a holder stops trusting a lease:
// the trust window of a grant or renewal ends at its send time (local monotonic clock) + TTL -
// margin. The margin covers clock-rate drift between client and server and the time between a
// trust check and the write it guards. It must be >= 0; each acquire checks that it is shorter
// than its TTL.
//
// Default: a tenth of each lease's TTL.
//
// Applies to [NewLessor] only.
func WithSafetyMargin(d time.Duration) Option {
	return func(c *config) error {
		c.set["WithSafetyMargin"] = true
		if d < 0 {
			return argError("WithSafetyMargin", "is %v; it must be >= 0", d)
		}
		c.margin = d
		return nil
	}
}

// WithBackoff sets the wait between attempts of [Lessor.Acquire] and [Lessor.RunLocked] while
// the lease is held by someone else. The wait is also capped by the current holder's remaining
// TTL, so an expiring lease is retried when it expires. b must not be nil.
//
// Default: ExponentialBackoff(5*time.Millisecond, 250*time.Millisecond).
//
// Applies to [NewLessor] only.
func WithBackoff(b Backoff) Option {
	return func(c *config) error {
		c.set["WithBackoff"] = true
		if b == nil {
			return argError("WithBackoff", "must not be nil")
		}
		c.backoff = b
		return nil
	}
}

// WithLogger sets the logger for renewal failures (Warn) and lost leases and locks (Error).
// Loss is also always signalled through Done and Err; logging is never the only signal.
// l must not be nil. Applies to [NewLessor] and [NewAdvisoryLocker].
//
// Default: a logger that discards everything.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		c.set["WithLogger"] = true
		if l == nil {
			return argError("WithLogger", "must not be nil")
		}
		c.logger = l
		return nil
	}
}

// Backoff returns how long to wait before retry number attempt (0 for the first retry). It
// must be stateless and safe for concurrent use: one Backoff serves every call of a lessor.
type Backoff func(attempt int) time.Duration

// ExponentialBackoff returns a [Backoff] that waits min * 2^attempt, capped at max, with
// "equal jitter": a uniform random wait in [d/2, d], so waiters that started together spread
// out. min and max are positive time.Durations with min <= max; otherwise it panics, as a
// programming error.
func ExponentialBackoff(min, max time.Duration) Backoff {
	if min <= 0 || max < min {
		panic(fmt.Sprintf("fencelock: ExponentialBackoff(%v, %v): need 0 < min <= max", min, max))
	}
	return func(attempt int) time.Duration {
		d := max
		if attempt < 62 && min<<attempt > 0 && min<<attempt < max {
			d = min << attempt
		}
		return d/2 + rand.N(d/2+1)
	}
}

func defaultHolder() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return host + ":" + strconv.Itoa(os.Getpid()) + ":" + strconv.FormatUint(rand.Uint64(), 16)
}
