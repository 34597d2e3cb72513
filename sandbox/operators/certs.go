package operators

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// servingCerts is one CA and one webhook serving certificate that every
// operator of a Set uses: the API server reaches each webhook server at
// https://127.0.0.1:<port>, so the certificate is for that address; the
// operators that rotate their own certificates (Kubeflow Trainer, the
// training-operator, through open-policy-agent/cert-controller) keep a
// certificate they find valid in their Secret, so it also carries the DNS name
// of each one's Service and the CA carries each one's CA name. Both of those
// operators write the certificate to the same fixed directory
// (/tmp/k8s-webhook-server/serving-certs), so sharing one certificate keeps
// them from overwriting each other's.
type servingCerts struct {
	caPEM, caKeyPEM     []byte
	certPEM, keyPEM     []byte
	caNames, serverDNSs []string
}

func newServingCerts(caNames, serverDNSNames []string) (*servingCerts, error) {
	now := time.Now()
	caKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tessera-operators-ca", Organization: []string{"tessera test operators"}},
		DNSNames:              caNames,
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		// cert-controller verifies its CA as a server certificate for the CA name.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("serving key: %w", err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		DNSNames:     append([]string{"localhost"}, serverDNSNames...),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	// PKCS#1 keys: cert-controller parses its Secret's CA key as PKCS#1.
	return &servingCerts{
		caPEM:      pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		caKeyPEM:   pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(caKey)}),
		certPEM:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:     pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		caNames:    caNames,
		serverDNSs: serverDNSNames,
	}, nil
}

// loadOrCreateServingCerts reuses the certificates kept in dir when they are
// for the same names, else makes new ones and keeps them there (one file,
// renamed into place, so a concurrent run reads either the old or the new set).
// Keeping them is what lets several runs on one machine coexist: the
// cert-controller operators all read /tmp/k8s-webhook-server/serving-certs,
// whoever wrote it last.
func loadOrCreateServingCerts(dir string, caNames, serverDNSNames []string) (*servingCerts, error) {
	path := filepath.Join(dir, "webhook-certs.pem")
	if data, err := os.ReadFile(path); err == nil {
		if c, ok := parseBundle(data); ok && slices.Equal(c.caNames, caNames) && slices.Equal(c.serverDNSs, serverDNSNames) {
			return c, nil
		}
	}
	c, err := newServingCerts(caNames, serverDNSNames)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(dir, ".webhook-certs-*")
	if err != nil {
		return nil, err
	}
	bundle := bytes.Join([][]byte{c.caPEM, c.caKeyPEM, c.certPEM, c.keyPEM}, nil)
	if _, err := tmp.Write(bundle); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return nil, err
	}
	return c, nil
}

// parseBundle reads CA, CA key, certificate and key, in that order.
func parseBundle(data []byte) (*servingCerts, bool) {
	var blocks [][]byte
	for {
		b, rest := pem.Decode(data)
		if b == nil {
			break
		}
		blocks = append(blocks, pem.EncodeToMemory(b))
		data = rest
	}
	if len(blocks) != 4 {
		return nil, false
	}
	c := &servingCerts{caPEM: blocks[0], caKeyPEM: blocks[1], certPEM: blocks[2], keyPEM: blocks[3]}
	ca, err := parseCert(c.caPEM)
	if err != nil {
		return nil, false
	}
	leaf, err := parseCert(c.certPEM)
	if err != nil || time.Until(leaf.NotAfter) < 24*time.Hour {
		return nil, false
	}
	c.caNames = ca.DNSNames
	for _, n := range leaf.DNSNames {
		if n != "localhost" {
			c.serverDNSs = append(c.serverDNSs, n)
		}
	}
	return c, true
}

func parseCert(p []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(p)
	if b == nil {
		return nil, fmt.Errorf("no PEM block")
	}
	return x509.ParseCertificate(b.Bytes)
}

// writeTo writes tls.crt and tls.key into dir, each renamed into place.
func (c *servingCerts) writeTo(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, data := range map[string][]byte{"tls.crt": c.certPEM, "tls.key": c.keyPEM} {
		if cur, err := os.ReadFile(filepath.Join(dir, name)); err == nil && bytes.Equal(cur, data) {
			continue
		}
		tmp, err := os.CreateTemp(dir, "."+name+"-*")
		if err != nil {
			return err
		}
		_, werr := tmp.Write(data)
		cerr := tmp.Close()
		if werr != nil || cerr != nil {
			_ = os.Remove(tmp.Name())
			return errors.Join(werr, cerr)
		}
		if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}

// secretData is the Secret layout cert-controller reads and writes.
func (c *servingCerts) secretData() map[string][]byte {
	return map[string][]byte{"ca.crt": c.caPEM, "ca.key": c.caKeyPEM, "tls.crt": c.certPEM, "tls.key": c.keyPEM}
}
