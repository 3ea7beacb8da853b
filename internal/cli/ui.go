package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

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
		// The poller's connections cannot write, whatever the role: every transaction is read-only.
		rcfg, err := s.poolConfig("")
		if err != nil {
			return err
		}
		rcfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
		reader, err := pgxpool.NewWithConfig(ctx, rcfg)
		if err != nil {
			return fmt.Errorf("connect: %w", err)
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
