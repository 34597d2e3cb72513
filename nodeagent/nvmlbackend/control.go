package nvmlbackend

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// The control socket is for tests only: the mock machine lives inside the
// tessera-node process that opened it, and a test that runs tessera-node as
// a process (the real-node tests) has no other way to make a GPU fail.

// ServeControl listens on a unix socket at path (backend option
// control=PATH) and applies each line a client sends to this machine,
// answering "ok" or "error: <why>":
//
//	xid <gpu> <n>            an XID critical error event (InjectXID; 79 also
//	                         makes the GPU lost)
//	ecc <gpu> single|double  an ECC error event (InjectECC)
//	lost <gpu>               the GPU falls off the bus (SetLost true)
//	back <gpu>               the GPU answers again, after a reset (SetLost false)
//	instances <gpu>          lists the GPU's MIG instances (GPU.Instances),
//	                         answered "ok" and one "<profile>@<start>(gi<ID>/ci<ID>)"
//	                         per instance, space separated (QueryControl)
//	hold <method>            a crash point: the method's calls (a MIG create
//	                         or destroy, GetMigMode; see hold.go) park at their entry, on
//	                         every GPU, until release or until the process dies
//	held <method>            how many of its calls are parked now, answered
//	                         "ok <n>" and the GPUs' UUIDs, space separated
//	release <method>         disarms the hold; parked calls go on
//
// <gpu> is an index or a UUID. The socket goes when the machine shuts down
// (its last Shutdown).
func (m *Mock) ServeControl(path string) error {
	_ = os.Remove(path) // a socket left by a process that was killed
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("mock control socket: %w", err)
	}
	m.mu.Lock()
	m.control = append(m.control, ln)
	m.mu.Unlock()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return // closed at shutdown
			}
			go m.serveControlConn(conn)
		}
	}()
	return nil
}

func (m *Mock) serveControlConn(conn net.Conn) {
	defer conn.Close()
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		reply := "ok"
		if out, err := m.control1(strings.Fields(line)); err != nil {
			reply = "error: " + err.Error()
		} else if out != "" {
			reply += " " + out
		}
		if _, err := fmt.Fprintln(conn, reply); err != nil {
			return
		}
	}
}

// control1 applies one command; a query's answer is returned.
func (m *Mock) control1(f []string) (string, error) {
	if len(f) < 2 {
		return "", fmt.Errorf("want <command> <gpu> [argument], got %q", strings.Join(f, " "))
	}
	if f[0] == "hold" || f[0] == "held" || f[0] == "release" {
		return m.controlHold(f)
	}
	uuid, err := m.gpuRef(f[1])
	if err != nil {
		return "", err
	}
	switch {
	case f[0] == "xid" && len(f) == 3:
		xid, err := strconv.ParseUint(f[2], 10, 64)
		if err != nil {
			return "", fmt.Errorf("xid: %q is not a number", f[2])
		}
		return "", m.InjectXID(uuid, xid)
	case f[0] == "ecc" && len(f) == 3 && (f[2] == "single" || f[2] == "double"):
		return "", m.InjectECC(uuid, f[2] == "double")
	case f[0] == "lost" && len(f) == 2:
		return "", m.SetLost(uuid, true)
	case f[0] == "back" && len(f) == 2:
		return "", m.SetLost(uuid, false)
	case f[0] == "instances" && len(f) == 2:
		g, err := m.GPU(uuid)
		if err != nil {
			return "", err
		}
		var out []string
		for _, in := range g.Instances() {
			out = append(out, in.String())
		}
		return strings.Join(out, " "), nil
	}
	return "", fmt.Errorf("unknown command %q (known: xid <gpu> <n>, ecc <gpu> single|double, lost <gpu>, back <gpu>, instances <gpu>, hold|held|release <method>)", strings.Join(f, " "))
}

// gpuRef resolves a GPU index or UUID.
func (m *Mock) gpuRef(ref string) (string, error) {
	if i, err := strconv.Atoi(ref); err == nil {
		if i < 0 || i >= len(m.gpus) {
			return "", fmt.Errorf("no GPU with index %d (the machine has %d)", i, len(m.gpus))
		}
		return m.gpus[i].UUID, nil
	}
	if _, err := m.GPU(ref); err != nil {
		return "", err
	}
	return ref, nil
}

// closeControlLocked closes the control sockets. Caller holds mu.
func (m *Mock) closeControlLocked() {
	for _, ln := range m.control {
		_ = ln.Close() // removes the socket file
	}
	m.control = nil
}

// SendControl sends one command to a mock machine's control socket (see
// ServeControl) and returns its error answer as an error.
func SendControl(ctx context.Context, socket, command string) error {
	_, err := QueryControl(ctx, socket, command)
	return err
}

// QueryControl sends one command to a mock machine's control socket and
// returns what its answer says after "ok" (instances lists them), or its
// error answer as an error.
func QueryControl(ctx context.Context, socket, command string) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return "", fmt.Errorf("mock control socket: %w", err)
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	} else {
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	if _, err := fmt.Fprintln(conn, command); err != nil {
		return "", fmt.Errorf("mock control socket: %w", err)
	}
	reply, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("mock control socket: no answer to %q: %w", command, err)
	}
	reply = strings.TrimSpace(reply)
	if reply == "ok" {
		return "", nil
	}
	if out, ok := strings.CutPrefix(reply, "ok "); ok {
		return out, nil
	}
	return "", errors.New("mock control: " + command + ": " + strings.TrimPrefix(reply, "error: "))
}
