package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// EnvPGBin names the variable holding the directory of the PostgreSQL server binaries
// (initdb, postgres) to use for local servers.
const EnvPGBin = "PG_BIN"

// Setting is one postgresql.conf parameter passed on a server's command line.
type Setting struct {
	Name, Value string
}

// DefaultSettings are passed to every server started for tests, before the caller's
// settings. They trade durability against an OS crash (which a test never survives anyway)
// for speed; a server process crash loses nothing, as WAL still reaches the kernel at commit.
var DefaultSettings = []Setting{
	{"fsync", "off"},
	{"full_page_writes", "off"},
	{"max_connections", "300"},
	{"shared_buffers", "64MB"},
}

// Flags returns settings as postgres command-line flags: "-c", "name=value", ...
func Flags(settings []Setting) []string {
	flags := make([]string, 0, 2*len(settings))
	for _, s := range settings {
		flags = append(flags, "-c", s.Name+"="+s.Value)
	}
	return flags
}

// IsBindError reports whether a server log says the server could not bind its port.
func IsBindError(log string) bool {
	return strings.Contains(log, "could not bind") || strings.Contains(log, "could not create any TCP/IP sockets")
}

// LoopbackURL returns the URL of the postgres database at host:port as user, with
// sslmode=disable.
func LoopbackURL(host string, port int, user *url.Userinfo) *url.URL {
	return &url.URL{
		Scheme:   "postgres",
		User:     user,
		Host:     net.JoinHostPort(host, strconv.Itoa(port)),
		Path:     "/postgres",
		RawQuery: "sslmode=disable",
	}
}

// Addr says how to reach a server: a postgres:// URL of one of its databases (Base), or
// else a keyword/value connection string (KV, "host=... user=...").
type Addr struct {
	Base *url.URL
	KV   string
}

// ParseAddr parses raw, a postgres:// URL or a keyword/value connection string (as
// FENCELOCK_TEST_DATABASE_URL holds), into an Addr and the name of the database raw names.
// It does not connect. Errors: raw does not parse.
func ParseAddr(raw string) (Addr, string, error) {
	cfg, err := pgx.ParseConfig(raw)
	if err != nil {
		return Addr{}, "", err
	}
	if !strings.HasPrefix(raw, "postgres://") && !strings.HasPrefix(raw, "postgresql://") {
		return Addr{KV: raw}, cfg.Database, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return Addr{}, "", err
	}
	return Addr{Base: u}, cfg.Database, nil
}

// URL returns a connection string of database on the server: Base with its path replaced,
// or KV with dbname appended (in the same form). It does not check that the database exists.
func (a Addr) URL(database string) string {
	if a.Base == nil {
		return a.KV + " dbname=" + quoteKeywordValue(database)
	}
	u := *a.Base
	u.Path = "/" + database
	u.RawPath = ""
	return u.String()
}

// quoteKeywordValue quotes v for a keyword/value connection string.
func quoteKeywordValue(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// ErrExited says a child process (postgres, pgbouncer) exited while the harness waited for
// it to accept connections.
var ErrExited = errors.New("exited while starting")

// WaitAccepting polls url until a connection succeeds (and closes it), backing off from 5 ms
// to 100 ms between attempts. It gives up when ctx ends or timeout passes, returning the last
// connection error too, or (an error wrapping [ErrExited]) when exited is closed; a nil
// exited never is. what names the program listening at url in errors ("postgres",
// "pgbouncer").
func WaitAccepting(ctx context.Context, what, url string, timeout time.Duration, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := 5 * time.Millisecond
	for {
		attemptCtx, cancelAttempt := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgconn.Connect(attemptCtx, url)
		cancelAttempt()
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		timer := time.NewTimer(delay)
		select {
		case <-exited:
			timer.Stop()
			return fmt.Errorf("pgserver: %s %w", what, ErrExited)
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("pgserver: %s did not accept connections within %s: %w (last attempt: %w)", what, timeout, ctx.Err(), err)
		case <-timer.C:
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}
