package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// amqpTLS builds the TLS configuration for amqps:// from RELAY_AMQP_CA,
// RELAY_AMQP_CERT and RELAY_AMQP_KEY; nil means the system defaults.
func (c *config) amqpTLS() (*tls.Config, error) {
	if c.AMQPCA == "" && c.AMQPCert == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.AMQPCA != "" {
		pem, err := os.ReadFile(c.AMQPCA)
		if err != nil {
			return nil, fmt.Errorf("RELAY_AMQP_CA: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("RELAY_AMQP_CA: no PEM certificate in %s", c.AMQPCA)
		}
	}
	if c.AMQPCert != "" {
		cert, err := tls.LoadX509KeyPair(c.AMQPCert, c.AMQPKey)
		if err != nil {
			return nil, fmt.Errorf("RELAY_AMQP_CERT/KEY: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// checkTLSFiles loads a CA bundle and a client certificate and key as the
// TLS client will; prefix names the variables.
func checkTLSFiles(prefix, ca, cert, key string) error {
	if ca != "" {
		pem, _ := os.ReadFile(ca)
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return badVar(prefix+"_CA", "no PEM certificate in %s", ca)
		}
	}
	if cert != "" {
		if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
			return badVar(prefix+"_CERT", "%s and %s are not a certificate and its key: %v", cert, prefix+"_KEY", err)
		}
	}
	return nil
}
