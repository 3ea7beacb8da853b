package pgserver

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/migrations"
)

// TemplateName is the migrated template database on servers the harness starts itself.
const TemplateName = "fencelock_template"

// MigrateFunc applies fencelock's migrations to the database behind pool; tests pass
// fencelock.Migrate (pgserver cannot import the library, see the package doc).
type MigrateFunc func(ctx context.Context, pool *pgxpool.Pool) error

// Cloner makes fresh test databases on one server by cloning a migrated template with
// CREATE DATABASE ... TEMPLATE. Its methods are safe for concurrent use; clones on one Cloner
// are serialised (PostgreSQL refuses two clones of one template at once).
type Cloner struct {
	addr    Addr
	maintDB string
	tplName string
	where   string // the server, for errors: "a local server"
	migrate MigrateFunc

	tplMu    sync.Mutex // guards tplDone; held while the template is built
	tplDone  bool
	createMu sync.Mutex // serialises CREATE DATABASE ... TEMPLATE
}

// NewCloner returns a Cloner for the server at addr: administrative statements run in
// database maintDB, the template is named template and built with migrate, and where names
// the server in errors ("a local server"). It does not connect.
func NewCloner(addr Addr, maintDB, template, where string, migrate MigrateFunc) *Cloner {
	return &Cloner{addr: addr, maintDB: maintDB, tplName: template, where: where, migrate: migrate}
}

// dbCounter numbers the databases CreateDatabase makes in this process.
var dbCounter atomic.Uint64

// CreateDatabase creates a fresh database with fencelock's schema and returns its name. The
// first call creates the template database and migrates it; every call then clones it, which
// costs tens of milliseconds. Names are t_<counter>_<random hex>, unique across processes
// sharing a server. The caller owns the database ([Cloner.DropDatabase] drops it).
//
// Errors: connection and SQL errors, wrapped; for a role without CREATEDB, an error that says
// so.
func (c *Cloner) CreateDatabase(ctx context.Context) (string, error) {
	if err := c.ensureTemplate(ctx); err != nil {
		return "", err
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := fmt.Sprintf("t_%d_%s", dbCounter.Add(1), hex.EncodeToString(b[:]))

	c.createMu.Lock()
	defer c.createMu.Unlock()
	conn, err := pgx.Connect(ctx, c.addr.URL(c.maintDB))
	if err != nil {
		return "", fmt.Errorf("pgserver: create database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+QuoteIdent(name)+" TEMPLATE "+QuoteIdent(c.tplName)); err != nil {
		return "", c.createError(conn, "create database "+name, err)
	}
	return name, nil
}

// createError wraps err from CREATE DATABASE, explaining a missing CREATEDB privilege.
func (c *Cloner) createError(conn *pgx.Conn, what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		return fmt.Errorf("pgserver: %s: role %q cannot create databases on %s; grant it CREATEDB (each test needs its own database): %w",
			what, conn.Config().User, c.where, err)
	}
	return fmt.Errorf("pgserver: %s: %w", what, err)
}

// templateLockKey is the session advisory lock key (in the maintenance database) that
// serialises template builds of processes sharing a server: "pgtestpl" in ASCII.
const templateLockKey int64 = 0x7067746573747066

// ensureTemplate creates and migrates the template database once per Cloner. Processes that
// share a server serialise on an advisory lock; a template left half-built by a killed
// process (not yet marked IS_TEMPLATE) is dropped and rebuilt. The finished template refuses
// connections, so no session can block the clones.
func (c *Cloner) ensureTemplate(ctx context.Context) error {
	c.tplMu.Lock()
	defer c.tplMu.Unlock()
	if c.tplDone {
		return nil
	}
	conn, err := pgx.Connect(ctx, c.addr.URL(c.maintDB))
	if err != nil {
		return fmt.Errorf("pgserver: template database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) // also releases the advisory lock
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, templateLockKey); err != nil {
		return fmt.Errorf("pgserver: template database: lock: %w", err)
	}
	var isTemplate bool
	err = conn.QueryRow(ctx, `SELECT datistemplate FROM pg_database WHERE datname = $1`, c.tplName).Scan(&isTemplate)
	switch {
	case err == nil && isTemplate:
		c.tplDone = true
		return nil
	case err == nil: // half-built by a process that died
		if _, err := conn.Exec(ctx, "DROP DATABASE "+QuoteIdent(c.tplName)+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("pgserver: template database: drop unfinished %s: %w", c.tplName, err)
		}
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("pgserver: template database: %w", err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+QuoteIdent(c.tplName)); err != nil {
		return c.createError(conn, "template database", err)
	}
	pool, err := pgxpool.New(ctx, c.addr.URL(c.tplName))
	if err != nil {
		return fmt.Errorf("pgserver: template database: %w", err)
	}
	err = c.migrate(ctx, pool)
	pool.Close()
	if err != nil {
		return fmt.Errorf("pgserver: template database: %w", err)
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+QuoteIdent(c.tplName)+" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("pgserver: template database: %w", err)
	}
	c.tplDone = true
	return nil
}

// DropDatabase drops database name, terminating its sessions (PostgreSQL 13 or later).
// Errors: connection and SQL errors, wrapped.
func (c *Cloner) DropDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, c.addr.URL(c.maintDB))
	if err != nil {
		return fmt.Errorf("pgserver: drop database %s: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+QuoteIdent(name)+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgserver: drop database %s: %w", name, err)
	}
	return nil
}

// QuoteIdent quotes an SQL identifier.
func QuoteIdent(name string) string { return pgx.Identifier{name}.Sanitize() }

// MigrationsHash returns a short hash (12 hex digits) of fencelock's migration files, so that
// processes with different migrations never share a template on an existing server. Errors:
// reading the embedded files.
func MigrationsHash() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("pgserver: hash migrations: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}
