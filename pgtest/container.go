package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/fencelock/fencelock/internal/pgserver"
)

const (
	// postgresImage is the image of container servers.
	postgresImage = "postgres:15"
	// dockerPingTimeout bounds the check for a Docker daemon.
	dockerPingTimeout = 5 * time.Second
)

// dockerAvailable returns nil if a Docker daemon answers a ping. It first looks for a hint of
// one (DOCKER_HOST, a socket at a default path, ~/.testcontainers.properties) so that a
// machine without Docker is told so at once, without testcontainers-go's discovery or logs.
func dockerAvailable(ctx context.Context) error {
	if !dockerHinted() {
		return errors.New("no Docker daemon: DOCKER_HOST is unset and there is no Docker socket at /var/run/docker.sock or a rootless path")
	}
	ctx, cancel := context.WithTimeout(ctx, dockerPingTimeout)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return fmt.Errorf("docker client: %w", err)
	}
	defer cli.Close()
	if _, err := cli.Ping(ctx, client.PingOptions{}); err != nil {
		return fmt.Errorf("docker ping: %w", err)
	}
	return nil
}

// dockerHinted reports whether anything points at a Docker daemon, checking the places
// testcontainers-go looks at.
func dockerHinted() bool {
	if os.Getenv("DOCKER_HOST") != "" {
		return true
	}
	paths := []string{"/var/run/docker.sock", filepath.Join("/run/user", strconv.Itoa(os.Getuid()), "docker.sock")}
	if dir := os.Getenv("XDG_RUNTIME_DIR"); dir != "" {
		paths = append(paths, filepath.Join(dir, "docker.sock"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		paths = append(paths,
			filepath.Join(home, ".docker", "run", "docker.sock"),
			filepath.Join(home, ".docker", "desktop", "docker.sock"),
			filepath.Join(home, ".testcontainers.properties"))
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// startContainer starts a postgres container through testcontainers-go's postgres module,
// with its data directory on a tmpfs, and waits until it accepts connections.
func startContainer(ctx context.Context, settings []setting) (*Server, error) {
	ctr, err := tcpostgres.Run(ctx, postgresImage,
		// The module's command is "postgres -c fsync=off"; append the settings to it.
		testcontainers.WithCmdArgs(pgserver.Flags(settings)...),
		testcontainers.WithTmpfs(map[string]string{"/var/lib/postgresql/data": "rw"}),
		// The log line twice (the entrypoint restarts the server after initdb), then the port.
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("pgtest: postgres container: %w", err), closeContainer(ctr))
	}
	fail := func(err error) (*Server, error) {
		return nil, errors.Join(fmt.Errorf("pgtest: postgres container: %w", err), closeContainer(ctr))
	}
	host, err := ctr.Host(ctx)
	if err != nil {
		return fail(err)
	}
	port, err := ctr.MappedPort(ctx, "5432/tcp")
	if err != nil {
		return fail(err)
	}
	// The module's defaults: user postgres, password postgres, database postgres.
	base := pgserver.LoopbackURL(host, int(port.Num()), url.UserPassword("postgres", "postgres"))
	if err := pgserver.WaitAccepting(ctx, "postgres", base.String(), time.Minute, nil); err != nil {
		return fail(err)
	}
	return &Server{kind: kindContainer, base: base, maintDB: "postgres", tplName: templateName, ctr: ctr}, nil
}

// closeContainer terminates ctr (and removes it and its volumes) if it is not nil.
func closeContainer(ctr *tcpostgres.PostgresContainer) error {
	if ctr == nil {
		return nil
	}
	if err := testcontainers.TerminateContainer(ctr); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	return nil
}
