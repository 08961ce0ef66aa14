#!/usr/bin/env bash
# Starts a control plane as a cluster runs it, all on loopback, state in DIR:
#   etcd          one member, --unsafe-no-fsync (a test's data is thrown away)
#   kube-apiserver TLS serving certificate, x509 client-certificate authentication,
#                 service-account keys and issuer, --authorization-mode=Node,RBAC,
#                 NodeRestriction admission, an audit log recording every request at
#                 Metadata level (DIR/audit.log, JSON lines, never rotated: tests read it
#                 whole), front-proxy (aggregation)
#                 and kubelet-client certificates
#   kube-controller-manager every default controller (node lifecycle, CSR signing,
#                 approving and cleaning, garbage collector...) with the cluster CA as
#                 --cluster-signing-cert-file/-key-file, each controller under its own
#                 service account as kubeadm runs it, and leader election as a cluster runs
#                 it (upstream's lease: 15 s, renewed within 10 s, tried every 2 s), so a
#                 kube-apiserver outage longer than 10 s makes it lose its lease and exit,
#                 to be started again (kubelet restarts its static pod; the tests' fixture,
#                 tests/src/control_plane.rs, does)
# Called by `scripts/control-plane.sh start DIR` with the bin directory; writes DIR/env (to
# source: KUBECONFIG for an admin, the URL and CA of the apiserver) and DIR/*.pid, logs in
# DIR/*.log. `scripts/control-plane.sh stop DIR` stops it.
# With EDGEBEAT_PREPARE_ONLY=1 (`scripts/control-plane.sh prepare DIR`, what the tests run):
# everything but starting the components, which the caller starts from DIR/run-*.sh as its
# own children (none left behind when it ends).
#
# Test-only settings (environment), written down where a test sets them:
#   EDGEBEAT_NODE_MONITOR_GRACE_PERIOD  kube-controller-manager --node-monitor-grace-period
#                                       (default 50s, the upstream default)
#   EDGEBEAT_NODE_MONITOR_PERIOD        --node-monitor-period (default 5s, upstream)
#   EDGEBEAT_ETCD_COMPACTION_INTERVAL   kube-apiserver --etcd-compaction-interval (default 5m)
#   EDGEBEAT_APISERVER_FLAGS, EDGEBEAT_CONTROLLER_MANAGER_FLAGS  more flags, space-separated
set -euo pipefail
bin="$1"
dir="$2"
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$dir"
umask 077

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# ---- PKI (openssl; every key new per control plane, none committed) ----
pki="$dir/pki"
mkdir -p "$pki"
ca() { # name subject
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "$2" \
    -keyout "$pki/$1.key" -out "$pki/$1.crt" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
}
leaf() { # name subject ca usage [subjectAltName]
  local ext="$pki/$1.ext"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$4"
    if [ -n "${5:-}" ]; then echo "subjectAltName=$5"; fi
  } > "$ext"
  openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$pki/$1.key" -out "$pki/$1.csr" 2>/dev/null
  openssl x509 -req -in "$pki/$1.csr" -CA "$pki/$3.crt" -CAkey "$pki/$3.key" -CAcreateserial \
    -days 30 -extfile "$ext" -out "$pki/$1.crt" 2>/dev/null
  rm -f "$pki/$1.csr" "$ext"
}
if [ ! -f "$pki/ca.crt" ]; then
  ca ca "/CN=edgebeat-test-cluster-ca"
  ca front-proxy-ca "/CN=edgebeat-test-front-proxy-ca"
  leaf apiserver "/CN=kube-apiserver" ca serverAuth \
    "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  leaf admin "/O=system:masters/CN=kubernetes-admin" ca clientAuth
  leaf controller-manager "/CN=system:kube-controller-manager" ca clientAuth
  leaf apiserver-kubelet-client "/O=kubeadm:cluster-admins/CN=kube-apiserver-kubelet-client" ca clientAuth
  leaf front-proxy-client "/CN=front-proxy-client" front-proxy-ca clientAuth
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
fi

etcd_port=$(free_port)
etcd_peer_port=$(free_port)
apiserver_port=$(free_port)
server="https://127.0.0.1:$apiserver_port"

kubeconfig() { # file user cert
  cat > "$dir/$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: edgebeat-test
  cluster:
    server: $server
    certificate-authority: $pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $pki/$3.crt
    client-key: $pki/$3.key
contexts:
- name: $2@edgebeat-test
  context: {cluster: edgebeat-test, user: $2}
current-context: $2@edgebeat-test
EOF
}
kubeconfig admin.kubeconfig kubernetes-admin admin
kubeconfig controller-manager.kubeconfig system:kube-controller-manager controller-manager

# Every request, at Metadata level (user, verb, resource, response code), once it is answered.
cat > "$dir/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
EOF

# Each component's command line is written to DIR/run-<component>.sh, so a test can stop one
# and start it again as it was (`scripts/control-plane.sh restart DIR kube-apiserver`). The
# script execs the component, so $! is the component's PID, the one `stop` signals.
launch() { # component
  "$dir/run-$1.sh" >> "$dir/$1.log" 2>&1 < /dev/null &
  echo $! > "$dir/$1.pid"
}

# ---- etcd ----
mkdir -p "$dir/etcd"
cat > "$dir/run-etcd.sh" <<EOF
#!/bin/sh
exec "$bin/etcd" --name default --data-dir "$dir/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" \
  --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster "default=http://127.0.0.1:$etcd_peer_port" \
  --unsafe-no-fsync --log-level warn
EOF

# ---- kube-apiserver ----
cat > "$dir/run-kube-apiserver.sh" <<EOF
#!/bin/sh
exec "$bin/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$etcd_port" \
  --etcd-compaction-interval "${EDGEBEAT_ETCD_COMPACTION_INTERVAL:-5m}" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$apiserver_port" \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" \
  --service-account-key-file "$pki/sa.pub" \
  --service-account-signing-key-file "$pki/sa.key" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --api-audiences https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range 10.96.0.0/16 \
  --authorization-mode Node,RBAC \
  --enable-admission-plugins NodeRestriction \
  --audit-policy-file "$dir/audit-policy.yaml" \
  --audit-log-path "$dir/audit.log" --audit-log-format json --audit-log-mode blocking \
  --audit-log-maxsize 100000 \
  --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
  --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority "$pki/ca.crt" \
  --requestheader-client-ca-file "$pki/front-proxy-ca.crt" \
  --requestheader-allowed-names front-proxy-client \
  --requestheader-username-headers X-Remote-User \
  --requestheader-group-headers X-Remote-Group \
  --requestheader-extra-headers-prefix X-Remote-Extra- \
  --proxy-client-cert-file "$pki/front-proxy-client.crt" \
  --proxy-client-key-file "$pki/front-proxy-client.key" \
  --enable-aggregator-routing \
  ${EDGEBEAT_APISERVER_FLAGS:-}
EOF

# ---- kube-controller-manager ----
cat > "$dir/run-kube-controller-manager.sh" <<EOF
#!/bin/sh
exec "$bin/kube-controller-manager" \
  --kubeconfig "$dir/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$dir/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$dir/controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port 0 \
  --use-service-account-credentials \
  --service-account-private-key-file "$pki/sa.key" \
  --root-ca-file "$pki/ca.crt" \
  --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
  --controllers '*' \
  --node-monitor-period "${EDGEBEAT_NODE_MONITOR_PERIOD:-5s}" \
  --node-monitor-grace-period "${EDGEBEAT_NODE_MONITOR_GRACE_PERIOD:-50s}" \
  ${EDGEBEAT_CONTROLLER_MANAGER_FLAGS:-}
EOF
chmod +x "$dir"/run-*.sh

cat > "$dir/env" <<EOF
export KUBECONFIG=$dir/admin.kubeconfig
export EDGEBEAT_APISERVER_URL=$server
export EDGEBEAT_CLUSTER_CA=$pki/ca.crt
export EDGEBEAT_CLUSTER_CA_KEY=$pki/ca.key
export EDGEBEAT_AUDIT_LOG=$dir/audit.log
export EDGEBEAT_CONTROL_PLANE_BIN=$bin
export EDGEBEAT_ETCD_URL=http://127.0.0.1:$etcd_port
export PATH=$bin:\$PATH
EOF

if [ "${EDGEBEAT_PREPARE_ONLY:-}" != 1 ]; then
  # By hand: in the background, until `scripts/control-plane.sh stop DIR`.
  launch etcd
  launch kube-apiserver
  "$here/scripts/control-plane.sh" wait "$dir" kube-apiserver
  launch kube-controller-manager
  "$here/scripts/control-plane.sh" wait "$dir" kube-controller-manager
fi
echo "$dir/env"
