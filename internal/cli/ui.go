package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/ui"
)

// uiSecretEnv names the environment variable that holds the access token of forced releases
// (not a flag, so that it does not show in the process list).
const uiSecretEnv = "FENCELOCK_UI_SECRET"

// uiCommand is "fencelock ui": the live view of package ui, served on its own.
func uiCommand(fs *flag.FlagSet) func(context.Context, *session, []string) error {
	listen := fs.String("listen", "127.0.0.1:8080", "serve on `ADDRESS` (host:port; port 0 picks one)")
	interval := fs.Duration("interval", 500*time.Millisecond, "poll the database every `duration` (100ms to 1m)")
	window := fs.Duration("window", 10*time.Minute, "the timeline's span (10s to 24h)")
	allow := fs.Bool("allow-release", false, "offer forced releases, to requests that carry the access token in "+uiSecretEnv)
	releaseURL := fs.String("release-database-url", "", "run forced releases on `URL` (default: the database URL), a role with the runtime grants")
	return func(ctx context.Context, s *session, args []string) error {
		if len(args) > 0 {
			return withCode(ExitUsage, "ui: unexpected argument %q", args[0])
		}
		opts := []ui.Option{ui.WithPollAlways(), ui.WithInterval(*interval), ui.WithWindow(*window),
			ui.WithLogger(slog.New(slog.NewTextHandler(s.stderr, nil)))}
		if *interval < 100*time.Millisecond || *interval > time.Minute {
			return withCode(ExitUsage, "ui: --interval %v: must be from 100ms to 1m", *interval)
		}
		if *window < 10*time.Second || *window > 24*time.Hour {
			return withCode(ExitUsage, "ui: --window %v: must be from 10s to 24h", *window)
		}
		if !*allow && *releaseURL != "" {
			return withCode(ExitUsage, "ui: --release-database-url needs --allow-release")
		}
		var secret string
		if *allow {
			secret = s.env(uiSecretEnv)
			if len(secret) < 16 {
				return withCode(ExitUsage, "ui: --allow-release needs an access token of at least 16 bytes in %s", uiSecretEnv)
			}
		}
		reader, err := s.uiReader(ctx)
		if err != nil {
			return err
		}
		defer reader.Close()
		if *allow {
			wcfg, err := s.poolConfig(*releaseURL)
			if err != nil {
				return err
			}
			writer, err := pgxpool.NewWithConfig(ctx, wcfg)
			if err != nil {
				return fmt.Errorf("connect: %w", err)
			}
			defer writer.Close()
			opts = append(opts, ui.WithForcedRelease(writer, ui.SecretAuthorizer(secret)))
		}
		h, err := ui.New(reader, opts...)
		if err != nil {
			return withCode(ExitUsage, "ui: %w", err)
		}
		defer h.Close()
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return withCode(ExitUsage, "ui: listen: %w", err)
		}
		mode := "read-only"
		if *allow {
			mode = "forced release allowed with the access token in " + uiSecretEnv
		}
		if _, err := fmt.Fprintf(s.stdout, "fencelock ui: serving http://%s/ (%s); ctrl-C stops\n", ln.Addr(), mode); err != nil {
			_ = ln.Close()
			return err
		}
		if host, _, _ := net.SplitHostPort(ln.Addr().String()); *allow && !net.ParseIP(host).IsLoopback() {
			fmt.Fprintf(s.stderr, "fencelock ui: warning: serving forced releases on %s over plain HTTP: the access token crosses the network in clear; put TLS in front\n", host)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		select {
		case err := <-served:
			return fmt.Errorf("ui: serve: %w", err)
		case <-ctx.Done():
		}
		h.Close() // ends the event streams, which Shutdown would wait for
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("ui: shut down: %w", err)
		}
		<-served
		return nil
	}
}

// uiReader returns the pool the view reads through. Its connections cannot write, whatever
// the role: every transaction is read-only (the startup parameter default_transaction_read_only).
// A pooler that refuses that parameter (PgBouncer, unless its ignore_startup_parameters lists
// it) gets a pool without it, and a warning: the role is then the only guard.
func (s *session) uiReader(ctx context.Context) (*pgxpool.Pool, error) {
	open := func(readOnly bool) (*pgxpool.Pool, error) {
		cfg, err := s.poolConfig("")
		if err != nil {
			return nil, err
		}
		if readOnly {
			cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
		}
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("connect: %w", err)
		}
		return p, nil
	}
	p, err := open(true)
	if err != nil {
		return nil, err
	}
	var pgErr *pgconn.PgError
	if err := p.Ping(ctx); errors.As(err, &pgErr) && pgErr.Code == "08P01" && strings.Contains(pgErr.Message, "default_transaction_read_only") {
		p.Close()
		fmt.Fprintf(s.stderr, "fencelock ui: warning: the server (a pooler) refuses the startup parameter default_transaction_read_only: the view's connections are not forced read-only; give --database-url a read-only role (README, \"Least privilege\")\n")
		return open(false)
	}
	// Any other error of the first connection: the view shows it and its polls retry.
	return p, nil
}
