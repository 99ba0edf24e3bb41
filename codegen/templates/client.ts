import type { Methods } from "./types";

/** A method name of the catalogue. */
export type MethodName = keyof Methods;
/** The params type of a method. */
export type ParamsOf<M extends MethodName> = Methods[M]["params"];
/** The result type of a method. */
export type ResultOf<M extends MethodName> = Methods[M]["result"];

/** A JSON-RPC error answered by the gateway. */
export class RpcError extends Error {
  readonly code: number;
  readonly data: unknown;
  constructor(code: number, message: string, data?: unknown) {
    super(message);
    this.name = "RpcError";
    this.code = code;
    this.data = data;
  }
}

interface RpcResponse {
  jsonrpc: "2.0";
  id: number | string | null;
  result?: unknown;
  error?: { code: number; message: string; data?: unknown };
}

/** A server-pushed notification (`heartbeat`, `session.completed`, ...). */
export interface Notification {
  method: string;
  params: unknown;
}

function unwrap<T>(response: RpcResponse): T {
  if (response.error) {
    throw new RpcError(response.error.code, response.error.message, response.error.data);
  }
  return response.result as T;
}

/** JSON-RPC over HTTP: `POST <baseUrl>/rpc` with a bearer token. */
export class HttpClient {
  private nextId = 1;
  constructor(
    private readonly baseUrl: string,
    private readonly token: string,
    private readonly fetchImpl: typeof fetch = fetch,
  ) {}

  async call<M extends MethodName>(method: M, params?: ParamsOf<M>): Promise<ResultOf<M>> {
    const id = this.nextId++;
    const res = await this.fetchImpl(`${this.baseUrl.replace(/\/$/, "")}/rpc`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${this.token}` },
      body: JSON.stringify({ jsonrpc: "2.0", id, method, params: params ?? {} }),
    });
    if (res.status === 401) {
      throw new RpcError(401, "Unauthorized");
    }
    return unwrap<ResultOf<M>>((await res.json()) as RpcResponse);
  }
}

/** Constructor of a WHATWG WebSocket (the global one in browsers and Node 22+). */
export type WebSocketCtor = new (url: string) => WebSocket;

/** JSON-RPC over WebSocket: `GET <url>?token=...`; notifications go to `onNotification`. */
export class WsClient {
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: unknown) => void }>();
  onNotification: (n: Notification) => void = () => {};

  private constructor(private readonly socket: WebSocket) {
    socket.addEventListener("message", (event: MessageEvent) => this.receive(String(event.data)));
    socket.addEventListener("close", () => {
      for (const p of this.pending.values()) p.reject(new RpcError(-32603, "Connection closed"));
      this.pending.clear();
    });
  }

  static connect(url: string, token: string, ctor?: WebSocketCtor): Promise<WsClient> {
    const Impl: WebSocketCtor = ctor ?? (globalThis as unknown as { WebSocket: WebSocketCtor }).WebSocket;
    const sep = url.includes("?") ? "&" : "?";
    const socket = new Impl(`${url}${sep}token=${encodeURIComponent(token)}`);
    return new Promise((resolve, reject) => {
      socket.addEventListener("open", () => resolve(new WsClient(socket)));
      socket.addEventListener("error", (e: Event) => reject(e));
    });
  }

  call<M extends MethodName>(method: M, params?: ParamsOf<M>): Promise<ResultOf<M>> {
    const id = this.nextId++;
    return new Promise<ResultOf<M>>((resolve, reject) => {
      this.pending.set(id, { resolve: (v) => resolve(v as ResultOf<M>), reject });
      this.socket.send(JSON.stringify({ jsonrpc: "2.0", id, method, params: params ?? {} }));
    });
  }

  close(): void {
    this.socket.close(1000);
  }

  private receive(text: string): void {
    const message = JSON.parse(text) as RpcResponse & { method?: string; params?: unknown };
    if (typeof message.method === "string") {
      this.onNotification({ method: message.method, params: message.params });
      return;
    }
    if (typeof message.id !== "number") return;
    const waiter = this.pending.get(message.id);
    if (!waiter) return;
    this.pending.delete(message.id);
    try {
      waiter.resolve(unwrap(message));
    } catch (e) {
      waiter.reject(e);
    }
  }
}
