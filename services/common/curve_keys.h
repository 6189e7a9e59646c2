// ZeroMQ CURVE keys for the control plane (docs/operations.md, "Security").
//
// Keys are 40-character Z85 strings (ZeroMQ's text form of a 32-byte key). A key file holds one
// key on its own line; lines that are empty or start with '#' are comments. `pdserve keygen`
// writes NAME.secret (mode 0600, the secret key) and NAME.public (its public key). A secret key
// file is enough to configure a peer: the public key is derived from it. A list file (the
// router's allowed worker keys) holds any number of public keys, one a line (`cat *.public`).
//
// Every error names the file and, for a malformed key, the line.
//
// Thread-safety: value types and pure functions.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace pdserve::services {

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};

// The CURVE settings of one ControlChannel. Disabled: plain TCP (the default).
struct CurveOptions {
  bool enabled = false;
  CurveKeyPair own;               // both sides
  std::string server_public_key;  // DEALER (worker): the router's public key
  // ROUTER: public keys of the workers allowed to connect. Empty: any client that completes
  // the CURVE handshake (traffic is encrypted, but anyone with a key pair may register).
  std::vector<std::string> allowed_client_keys;
};

// True when libzmq was built with CURVE (zmq_has("curve")).
bool CurveAvailable();
// A fresh key pair. Errors: Unimplemented (libzmq without CURVE), Internal.
Result<CurveKeyPair> GenerateCurveKeyPair();
// Validates one Z85 key. Errors: InvalidArgument naming `where`.
Status CheckCurveKey(const std::string& key, const std::string& where);

// Reads a file holding exactly one key. Errors: NotFound, InvalidArgument (no key, several
// keys, a malformed key; naming the file and line).
Result<std::string> ReadCurveKeyFile(const std::string& path);
// Reads a file holding any number of keys (at least one).
Result<std::vector<std::string>> ReadCurveKeyListFile(const std::string& path);
// Reads a secret key file and derives the public key.
Result<CurveKeyPair> ReadCurveSecretKeyFile(const std::string& path);

// Router side: secret key file + optional allowed-clients list file ("" = any client).
// Worker side: own secret key file + the router's public key file. Both files are required.
// Errors: as the readers above, and InvalidArgument when CURVE is not available.
Result<CurveOptions> LoadServerCurveOptions(const std::string& secret_key_file, const std::string& allowed_clients_file);
Result<CurveOptions> LoadClientCurveOptions(const std::string& secret_key_file, const std::string& server_public_key_file);

// Writes DIR/NAME.secret (0600) and DIR/NAME.public. Errors: Internal (with errno text),
// AlreadyExists when either file exists (keys are never overwritten silently).
Result<CurveKeyPair> WriteCurveKeyPairFiles(const std::string& dir, const std::string& name);

}  // namespace pdserve::services
