package pgtemp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoPgBouncer is returned by StartPgBouncer when no pgbouncer binary is
// found.
var ErrNoPgBouncer = errors.New("pgtemp: no pgbouncer binary; apt-get install pgbouncer")

// PgBouncer is a running PgBouncer that StartPgBouncer started, in
// transaction pooling mode in front of a Server.
type PgBouncer struct {
	// DSN connects to the database through the bouncer, over TCP on
	// 127.0.0.1, as the server's superuser (the bouncer trusts it).
	DSN string
	// Port is the bouncer's TCP port on 127.0.0.1.
	Port int

	dir  string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// StartPgBouncer starts pgbouncer in transaction pooling mode in front of s,
// for database db; it returns a *PgBouncer whose DSN connects to db through
// it over TCP 127.0.0.1, and Stop stops it and removes its files.
//
// The bouncer reaches the server through its unix socket, as the superuser,
// with at most 20 server connections for up to 500 clients. It keeps no
// session state for its clients: a session's prepared statements, settings
// and temporary tables stay on whichever server connection ran them, and no
// reset query clears them. Like the server, it runs as the "postgres" user
// when the tests run as root, and it dies with the test binary.
func (s *Server) StartPgBouncer(db string) (*PgBouncer, error) {
	bin, err := findPgBouncer()
	if err != nil {
		return nil, err
	}
	if s == nil || s.dir == "" || s.Port == 0 {
		return nil, errors.New("pgtemp: pgbouncer: the server was never started")
	}
	// The name is a key of pgbouncer's [databases] section, unquoted.
	if db == "" || strings.ContainsAny(db, " \t\r\n=;#[]'\"\\") {
		return nil, fmt.Errorf("pgtemp: pgbouncer: database name %q is not a plain name", db)
	}
	dir, err := os.MkdirTemp("", "idempg-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("pgtemp: %w", err)
	}
	b := &PgBouncer{dir: dir, done: make(chan struct{}), log: filepath.Join(dir, "pgbouncer.log")}
	if err := b.start(bin, s, db); err != nil {
		b.Stop()
		return nil, err
	}
	return b, nil
}

func (b *PgBouncer) start(bin string, s *Server, db string) error {
	const superuser = "idempg"
	port, err := freePort()
	if err != nil {
		return err
	}
	ini := filepath.Join(b.dir, "pgbouncer.ini")
	users := filepath.Join(b.dir, "userlist.txt")
	config := strings.Join([]string{
		"[databases]",
		fmt.Sprintf("%s = host=%s port=%d user=%s dbname=%s", db, quoteConnValue(s.dir), s.Port, superuser, quoteConnValue(db)),
		"",
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(port),
		// TCP only: no socket in /tmp to collide with another bouncer's.
		"unix_socket_dir =",
		"pidfile = " + filepath.Join(b.dir, "pgbouncer.pid"),
		"auth_type = trust",
		"auth_file = " + users,
		"pool_mode = transaction",
		"default_pool_size = 20",
		"max_client_conn = 500",
		// pgx sends none of these by default; other drivers (and the
		// pgx of a DSN that sets them) do.
		"ignore_startup_parameters = extra_float_digits,search_path,default_transaction_isolation",
		"server_reset_query =",
		"",
	}, "\n")
	if err := os.WriteFile(ini, []byte(config), 0o644); err != nil {
		return fmt.Errorf("pgtemp: %w", err)
	}
	// With trust, the password is not checked, but the user must be listed.
	if err := os.WriteFile(users, []byte(`"`+superuser+`" ""`+"\n"), 0o644); err != nil {
		return fmt.Errorf("pgtemp: %w", err)
	}
	cred, err := credential()
	if err != nil {
		return err
	}
	if cred != nil {
		// pgbouncer refuses root too: its directory (for its pid file) goes
		// to the user it runs as.
		for _, p := range []string{b.dir, ini, users} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return fmt.Errorf("pgtemp: give %s to the postgres user: %w", p, err)
			}
		}
	}
	logf, err := os.Create(b.log)
	if err != nil {
		return fmt.Errorf("pgtemp: %w", err)
	}
	defer logf.Close()
	// Not daemonized (no -d): it logs to stderr, and stays our child.
	b.cmd = exec.Command(bin, ini)
	b.cmd.Stdout, b.cmd.Stderr = logf, logf
	// Pdeathsig: a test binary that dies takes its bouncer with it.
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if err := b.cmd.Start(); err != nil {
		return fmt.Errorf("pgtemp: start pgbouncer: %w", err)
	}
	go func() {
		_ = b.cmd.Wait()
		close(b.done)
	}()
	b.Port = port
	b.DSN = fmt.Sprintf("host=127.0.0.1 port=%d user=%s dbname=%s sslmode=disable", port, superuser, quoteConnValue(db))
	return b.ready()
}

// ready waits until the bouncer accepts a connection and runs a query on
// the server through it.
func (b *PgBouncer) ready() error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, b.DSN)
		if err == nil {
			// The simple protocol: no prepared statement left behind on a
			// server connection.
			_, err = conn.Exec(ctx, "SELECT 1", pgx.QueryExecModeSimpleProtocol)
			_ = conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-b.done:
			return fmt.Errorf("pgtemp: pgbouncer exited at start-up:\n%s", b.logTail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtemp: pgbouncer not ready after 30s: %w\n%s", err, b.logTail())
		}
	}
}

// Stop stops the bouncer (an immediate shutdown, then SIGKILL after 10s)
// and removes its directory. It may be called on a nil PgBouncer and more
// than once.
func (b *PgBouncer) Stop() {
	if b == nil {
		return
	}
	if b.cmd != nil && b.cmd.Process != nil {
		_ = b.cmd.Process.Signal(syscall.SIGTERM) // immediate shutdown
		select {
		case <-b.done:
		case <-time.After(10 * time.Second):
			_ = b.cmd.Process.Kill()
			<-b.done
		}
	}
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}

func (b *PgBouncer) logTail() string {
	out, _ := os.ReadFile(b.log)
	if len(out) > 4000 {
		out = out[len(out)-4000:]
	}
	return string(out)
}

// findPgBouncer returns the path of the pgbouncer binary: on PATH, or
// Debian's /usr/sbin/pgbouncer (not on a non-root PATH).
func findPgBouncer() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	const debian = "/usr/sbin/pgbouncer"
	if fi, err := os.Stat(debian); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
		return debian, nil
	}
	return "", ErrNoPgBouncer
}

// quoteConnValue quotes v for a keyword/value connection string (libpq's,
// which pgx and pgbouncer's [databases] section read alike) when it needs
// it.
func quoteConnValue(v string) string {
	if v != "" && !strings.ContainsAny(v, ` '\`) {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
