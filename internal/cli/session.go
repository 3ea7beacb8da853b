package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// applicationName is the application_name of the command's connections, unless the URL sets
// one: pg_stat_activity then says who is looking. It does not start with "fencelock " (with a
// space), the prefix by which fencelock.advisory_locks names the sessions of advisory locks.
const applicationName = "fencelock-cli"

// connectTimeout bounds each connection attempt when the URL sets no connect_timeout.
const connectTimeout = 10 * time.Second

// session is one Run: its streams, its global flags and its connection pool, opened on first
// use and closed by close.
type session struct {
	env            func(string) string
	stdin          io.Reader
	stdout, stderr io.Writer

	url  string // --database-url
	json bool   // --json

	db *pgxpool.Pool
}

// pool returns the session's pool, connecting on first use. Errors: an ExitUsage error when
// no URL is given or it does not parse; the connection's error.
func (s *session) pool(ctx context.Context) (*pgxpool.Pool, error) {
	if s.db != nil {
		return s.db, nil
	}
	cfg, err := s.poolConfig("")
	if err != nil {
		return nil, err
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	s.db = p
	return p, nil
}

// poolConfig returns the configuration of a pool of url, else of --database-url or
// DATABASE_URL: two connections at most, the command's application_name and connect timeout,
// and statements cancelled on the server when their context ends. Errors: an ExitUsage error
// when no URL is given or it does not parse.
func (s *session) poolConfig(url string) (*pgxpool.Config, error) {
	if url == "" {
		url = s.url
	}
	if url == "" && s.env != nil {
		url = s.env("DATABASE_URL")
	}
	if url == "" {
		return nil, withCode(ExitUsage, "no database: give --database-url or set DATABASE_URL")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, withCode(ExitUsage, "database URL: %w", err)
	}
	// Two connections at most: release watches its own blocked statement from the second.
	cfg.MaxConns = 2
	cfg.MinConns = 0
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = applicationName
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	// A statement cut short (ctrl-C during a release waiting for the lease row) is cancelled on
	// the server too, not only abandoned by the client: pgx's default closes the socket, and the
	// backend would wait on for the row until the holder's transaction ended.
	cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: time.Second}
	}
	return cfg, nil
}

// close closes the pool, if one was opened.
func (s *session) close() {
	if s.db != nil {
		s.db.Close()
	}
}

// where names the database for headers: "host/dbname", with ":port" when it is not 5432.
func (s *session) where() string {
	if s.db == nil {
		return ""
	}
	c := s.db.Config().ConnConfig
	host := c.Host
	if c.Port != 0 && c.Port != 5432 {
		host += ":" + strconv.Itoa(int(c.Port))
	}
	return host + "/" + c.Database
}

// printJSON writes v as one JSON document, indented, to stdout.
func (s *session) printJSON(v any) error {
	enc := json.NewEncoder(s.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// dbError wraps err from a statement of what, adding a hint when the schema is missing or
// older than the command needs.
func dbError(what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "3F000", "42P01", "42883": // invalid_schema_name, undefined_table, undefined_function
			return fmt.Errorf("%s: %w (is fencelock's schema at version 5 or later? run fencelock migrate)", what, err)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}
