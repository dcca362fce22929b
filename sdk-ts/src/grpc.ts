/** The dpagg gRPC services loaded from the repository's proto/ files at start-up, and their credentials. */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

export const DEFAULT_PROTO_DIR = fileURLToPath(new URL('../../proto', import.meta.url));

/** Mutual TLS: the deployment's CA, this party's certificate and key; the server's DNS name (`<role>.dpagg`). */
export interface Tls { ca: string; cert: string; key: string; serverName?: string }

export interface Connection { target: string; tls?: Tls; insecure?: boolean; protoDir?: string; timeoutSeconds?: number }

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Client = grpc.Client & Record<string, any>;

export function loadClient(service: 'Computation' | 'Analyst', conn: Connection, defaultServerName: string): Client {
  const file = service === 'Computation' ? 'dpagg/v1/computation.proto' : 'dpagg/v1/analyst.proto';
  const def = protoLoader.loadSync([file], {
    includeDirs: [conn.protoDir ?? DEFAULT_PROTO_DIR], keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
  });
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const ctor = (grpc.loadPackageDefinition(def) as any).dpagg.v1[service] as typeof grpc.Client;
  if (conn.insecure) return new ctor(conn.target, grpc.credentials.createInsecure()) as Client;
  if (!conn.tls) throw new Error('mutual TLS needs tls: {ca, cert, key} (or insecure: true for a test server)');
  const name = conn.tls.serverName ?? defaultServerName;
  const creds = grpc.credentials.createSsl(readFileSync(conn.tls.ca), readFileSync(conn.tls.key), readFileSync(conn.tls.cert));
  return new ctor(conn.target, creds, { 'grpc.ssl_target_name_override': name, 'grpc.default_authority': name,
    'grpc.max_receive_message_length': 64 << 20, 'grpc.max_send_message_length': 64 << 20 }) as Client;
}

/** A gRPC error as dpagg reports it: "CODE: details", with the status code kept. */
export class ServiceError extends Error {
  override name = 'ServiceError';
  readonly code: string;
  constructor(code: string, details: string, method: string) {
    super(`${code}: ${details} (${method})`);
    this.code = code;
  }
}

export function asServiceError(err: unknown, method: string): ServiceError | unknown {
  const e = err as grpc.ServiceError;
  if (e && typeof e.code === 'number') return new ServiceError(grpc.status[e.code] ?? String(e.code), e.details ?? e.message, method);
  return err;
}

export function deadline(seconds: number): Date {
  return new Date(Date.now() + seconds * 1000);
}

/** A unary call as a promise (ServiceError on failure). */
export function unary<Req, Res>(client: Client, method: string, req: Req, seconds: number): Promise<Res> {
  return new Promise((resolve, reject) => {
    client[method](req, { deadline: deadline(seconds) }, (err: unknown, res: Res) => {
      if (err) reject(asServiceError(err, method)); else resolve(res);
    });
  });
}
