package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
)

// testCA makes a CA and a server certificate for 127.0.0.1, writes the CA
// to dir/ca.pem and returns the server's TLS config.
func testCA(t *testing.T, dir string) *tls.Config {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "relayd test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{srvDER}, PrivateKey: srvKey}}, MinVersion: tls.VersionTLS12}
}

// relayd reaches a NATS server over TLS with a password, and a Postgres
// URL with a password; through an outage and its error logs, neither
// password (nor RabbitMQ's) appears in anything relayd prints. Without the
// CA the TLS connection is refused at start.
func TestTLSAndNoSecretsInLogs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const natsPass, pgPass = "n4ts-s3cret-pw", "pg-s3cret-pw"
	port := freePort(t)
	opts := &natsserver.Options{Port: port, JetStream: true, StoreDir: dir,
		Username: "relay", Password: natsPass, TLSConfig: testCA(t, dir), TLSTimeout: 2}
	start := func() *natsserver.Server { return testenv.NATSServer(t, opts) }
	ns := start()

	natsURL := fmt.Sprintf("tls://relay:%s@127.0.0.1:%d", natsPass, port)
	e := newEnvNATS(t, natsURL, nats.RootCAs(filepath.Join(dir, "ca.pem")))
	// Trust auth ignores the password, so the URL can carry one to leak.
	e.dbURL = strings.Replace(e.dbURL, "postgres://root@", "postgres://root:"+pgPass+"@", 1)
	if !strings.Contains(e.dbURL, pgPass) {
		t.Fatalf("could not put a password into %s", e.dbURL)
	}

	// Without the CA: refused at start, and the message says why without the password.
	cmd := exec.Command(relaydBin, "run")
	cmd.Env = e.relayEnv("RELAY_STARTUP_TIMEOUT=2s")
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "x509") {
		t.Fatalf("without RELAY_NATS_CA: exit %d, %q; want exit 1 with a certificate error", cmd.ProcessState.ExitCode(), out)
	}
	logs := string(out)

	r := e.startRelay("relay", "RELAY_NATS_CA="+filepath.Join(dir, "ca.pem"), "RELAY_LOG_LEVEL=debug")
	if _, err := e.writer.Write(t.Context(), e.pool, outbox.Message{Topic: "orders.tls", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	e.waitDelivered(30 * time.Second)
	ns.Shutdown()
	ns.WaitForShutdown()
	if _, err := e.writer.Write(t.Context(), e.pool, outbox.Message{Topic: "orders.tls", Payload: []byte("y")}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // let the outage produce its error logs
	start()                     // back; the test's end stops it
	e.waitDelivered(60 * time.Second)
	r.stop(30 * time.Second)
	logs += r.out.String()

	if !strings.Contains(logs, "nats disconnected") {
		t.Fatalf("no outage in the logs; the check below would prove little:\n%s", logs)
	}
	for _, secret := range []string{natsPass, pgPass, "guest:guest"} {
		if strings.Contains(logs, secret) {
			t.Errorf("logs contain the secret %q:\n%s", secret, logs)
		}
	}
}
