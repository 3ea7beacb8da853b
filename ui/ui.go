// Package ui is fencelock's live view in the browser: who holds each lease, since when, with
// which fencing token and TTL left, whether its heartbeat is alive, who waits and who is next;
// advisory locks and the backends that hold or await them; semaphores' permits of their limit;
// elections' leaders and terms; jobs' runs; fences' high-water marks; rate limits' buckets;
// and for one lease name, its queue in order and a timeline of its holders over the last
// minutes (hand-offs, expiries, forced releases, with tokens). Pages follow the database live
// through server-sent events, without reloads.
//
// [New] returns an [http.Handler] that a service mounts in its own admin server (under a
// prefix with [http.StripPrefix]); the command `fencelock ui` serves it on its own.
//
//	h, err := ui.New(readOnlyPool)
//	if err != nil { ... }
//	defer h.Close()
//	adminMux.Handle("/locks/", http.StripPrefix("/locks", h))
//
// # Cost on the database
//
// One poller per Handler reads everything the pages show with one statement per poll
// ([WithInterval], 500 ms by default; pgxpool adds its liveness check of a connection idle
// for over a second when the interval is that long) while at least one page is open, whatever
// the number of pages open, and does not poll while none is ([WithPollAlways] polls regardless, so that the
// timeline also covers the time nobody looked). Every page open shares what it read. The
// statement only reads: give the Handler a pool of the read-only role of README's "Least
// privilege" section. Each list is cut at [WithMaxRows] rows, which the page then says.
//
// # The timeline
//
// The timeline is kept in this process's memory from what successive polls see: no table, no
// write per grant. A grant that begins and ends between two polls shows only if its row is
// still the name's at the next poll. How a grant ended is named only when the polls can tell:
// "released" (its row's expiry moved back, or the next grant began before the expiry seen
// last, or a release handed it on), "expired" (its row reached its expiry with no renewal and
// was still the name's at the next poll), "forced release", and "ended" otherwise (say, a
// holder that renewed after the last poll, then released: the rows cannot tell that from an
// expiry). A forced
// release made elsewhere (`fencelock release --force`) that handed the lease on shows as a
// release. The axis runs from the first grant kept to now, at most [WithWindow] back (10
// minutes by default); at most 10,000 names of 64 grants each, 100,000 grants in all, are
// kept (the oldest grants of a name go first; a name or grant beyond is not kept). It sees
// only the names of the lease list as cut at [WithMaxRows] (the first in the order of the
// names), and while the list is cut it ends no grant it does not see.
//
// # Forced release
//
// The view is read-only unless built [WithForcedRelease]: a page then offers, for each held
// lease, a forced release with the semantics of `fencelock release --force NAME --token T`
// (the grant ends; the lease goes to the head of its queue with a fresh token or stays free,
// a semaphore's permit to the head of the semaphore's queue, and the answer names who got it;
// the high-water mark of NAME and of the resources given is raised to that token, so the old
// holder's fenced writes are refused). The page asks for a confirmation naming the holder and
// the token; the request must come from the page itself (Go's [http.CrossOriginProtection]
// and a CSRF token of the page) and be authenticated by the authorize function given; the
// release applies only to that grant (its token, its holder) and changes nothing otherwise. A
// refused request says why, in its JSON answer, and changes nothing.
//
// # Dependencies
//
// The standard library only, beside pgx: net/http (its ServeMux patterns, server-sent events
// through [http.ResponseController], [http.CrossOriginProtection]), html/template (every value
// escaped; the timeline is SVG drawn by the template), embed (the page's script, about 200
// lines, and its style, committed and served from the binary: no build step, nothing fetched
// at run time). Server-sent events rather than WebSockets: one direction is all a live view
// needs, browsers reconnect by themselves, and the standard library serves them; a page
// morphs its live part in place rather than replacing it. The tabs of one browser share one
// event stream ("events?page=A&page=B...", one event name per page), held by a SharedWorker
// that the page's script starts from itself: over HTTP/1.1 a browser opens six connections per
// host, and a stream per tab left a seventh tab unable to load (issue 39). A browser without
// SharedWorker opens a stream per tab, as before. The peers operators like (River UI,
// Consul's UI) carry a JavaScript build and a bundler; a library page embedded in a user's
// admin server should not. A consumer that does not import package ui compiles none of it.
package ui

import (
	"context"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/liveview"
	"github.com/fencelock/fencelock/internal/validate"
)

// Handler is the live view: an [http.Handler] and its poller. Safe for concurrent use. Close
// it to stop the poller and end the pages' event streams.
type Handler struct {
	srv    *liveview.Server
	cancel context.CancelFunc
	done   chan struct{} // closed by Close
	wg     sync.WaitGroup
	once   sync.Once
}

// Option configures a [Handler]; [New] takes them.
type Option func(*config) error

type config struct {
	liveview.Config
}

// WithInterval sets the time between polls, from 100 ms to 1 minute; the pages show a
// change within about one interval. Default 500 ms.
func WithInterval(d time.Duration) Option {
	return func(c *config) error {
		if d < 100*time.Millisecond || d > time.Minute {
			return validate.Errorf("WithInterval", "must be from 100ms to 1m, got %v", d)
		}
		c.Interval = d
		return nil
	}
}

// WithWindow sets how far back the timeline of a name goes, from 10 seconds to 24 hours.
// Default 10 minutes.
func WithWindow(d time.Duration) Option {
	return func(c *config) error {
		if d < 10*time.Second || d > 24*time.Hour {
			return validate.Errorf("WithWindow", "must be from 10s to 24h, got %v", d)
		}
		c.Window = d
		return nil
	}
}

// WithMaxRows sets how many rows each list (leases, waiters, advisory locks, semaphores,
// leaders, jobs, fences, rate-limited keys) holds at the most, from 1 to 100,000; a page says
// when its list was cut. Default 1,000.
func WithMaxRows(n int) Option {
	return func(c *config) error {
		if n < 1 || n > 100_000 {
			return validate.Errorf("WithMaxRows", "must be from 1 to 100000, got %d", n)
		}
		c.MaxRows = n
		return nil
	}
}

// WithPollAlways makes the poller poll every interval from New to Close, not only while a
// page is open, so that the timeline covers the time nobody looked.
func WithPollAlways() Option {
	return func(c *config) error { c.Always = true; return nil }
}

// WithLogger sets the logger of failed polls and of forced releases (who, which grant, the
// fence token). Default: [slog.Default].
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return validate.Errorf("WithLogger", "must not be nil")
		}
		c.Logger = l
		return nil
	}
}

// WithForcedRelease allows forced releases, run on writer (a pool of a role with the runtime
// grants of README's "Least privilege"), for requests that authorize accepts: it returns who
// sent the request (for the log), or an error saying why it is not authenticated, which the
// page shows. Mounted in a service, authorize reads what the service's own authentication
// middleware put in the request's context; [SecretAuthorizer] checks a shared secret.
// authorize must be safe for concurrent use.
func WithForcedRelease(writer *pgxpool.Pool, authorize func(*http.Request) (string, error)) Option {
	return func(c *config) error {
		if writer == nil {
			return validate.Errorf("WithForcedRelease", "writer must not be nil")
		}
		if authorize == nil {
			return validate.Errorf("WithForcedRelease", "authorize must not be nil")
		}
		c.Writer, c.Authorize = writer, authorize
		return nil
	}
}

// SecretAuthorizer returns an authorize function for [WithForcedRelease] that accepts a
// request carrying secret as a bearer token ("Authorization: Bearer SECRET") or as the
// password of basic authentication (any user name), compared in constant time. It names the
// caller "bearer" or the basic user name. It panics if secret is shorter than 16 bytes.
func SecretAuthorizer(secret string) func(*http.Request) (string, error) {
	if len(secret) < 16 {
		panic("ui.SecretAuthorizer: the secret must be at least 16 bytes")
	}
	match := func(s string) bool { return subtle.ConstantTimeCompare([]byte(s), []byte(secret)) == 1 }
	return func(r *http.Request) (string, error) {
		if user, pass, ok := r.BasicAuth(); ok {
			if match(pass) {
				return user, nil
			}
			return "", errors.New("wrong password")
		}
		if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			if match(tok) {
				return "bearer", nil
			}
			return "", errors.New("wrong access token")
		}
		return "", errors.New("no credentials: give the access token")
	}
}

// New returns the live view of the fencelock schema that reader reaches, and starts its
// poller. reader should be a pool of the read-only role (README, "Least privilege"): the view
// only reads through it. Errors: an [*fencelock.ArgumentError] (matching
// fencelock.ErrInvalidArgument) for a nil pool or a bad option. No SQL runs until a page opens
// (or at once, [WithPollAlways]).
//
// Defaults: a poll every 500 ms while a page is open, a timeline of 10 minutes, lists of at
// most 1,000 rows, read-only, [slog.Default] as the logger.
func New(reader *pgxpool.Pool, opts ...Option) (*Handler, error) {
	if reader == nil {
		return nil, validate.Errorf("reader", "must not be nil")
	}
	c := config{liveview.Config{Interval: 500 * time.Millisecond, Window: 10 * time.Minute, MaxRows: 1000, Logger: slog.Default()}}
	for _, o := range opts {
		if o == nil {
			return nil, validate.Errorf("option", "must not be nil")
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Handler{cancel: cancel, done: make(chan struct{})}
	h.srv = liveview.NewServer(reader, c.Config, h.done)
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		h.srv.Poller().Run(ctx)
	}()
	return h, nil
}

// ServeHTTP serves the pages (leases at "/" and "leases", "advisory", "semaphores",
// "elections", "jobs", "fences", "ratelimits", "name?n=NAME"), their event streams
// ("events?page=P", or several pages' in one: "events?page=P&page=name&n=NAME...") and forced
// releases (POST "release"), all at paths relative to where it is
// mounted.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	select {
	case <-h.done:
		http.Error(w, "fencelock live view: closed", http.StatusServiceUnavailable)
		return
	default:
	}
	h.srv.ServeHTTP(w, r)
}

// Close stops the poller, ends the event streams of the pages open and waits for the poller to
// return. Later requests get 503. It is safe to call more than once.
func (h *Handler) Close() {
	h.once.Do(func() {
		close(h.done)
		h.cancel()
	})
	h.wg.Wait()
}
