// `dki mcp --port`: the memory server over MCP's Streamable HTTP, on the loopback interface only.
// Each POST is authenticated by its bearer key, and a server for that key's user answers it
// (stateless: no MCP session outlives its request, so no session can be carried over to another
// key). Host and Origin are checked against the loopback names, so a web page's script cannot
// reach the server through DNS rebinding.
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import type { KeyTable } from "./keys.js";
import { createMemoryServer, type MemoryServerOptions } from "./server.js";

export const MCP_PATH = "/mcp";
/** A request body larger than this is refused before it is parsed. */
export const MAX_BODY_BYTES = 4 * 2 ** 20;

export interface McpHttpOptions extends Omit<MemoryServerOptions, "userId"> {
  keys: KeyTable;
  /** 0: any free port (the returned url names it). */
  port: number;
}

export interface McpHttpServer {
  url: string;
  port: number;
  close(): Promise<void>;
}

export async function serveMcpHttp(o: McpHttpOptions): Promise<McpHttpServer> {
  let port = o.port;
  const http = createServer((req, res) => {
    handle(req, res).catch((e: unknown) => {
      if (!res.headersSent) refuse(res, 500, -32603, `internal error: ${e instanceof Error ? e.message : String(e)}`);
      else res.end();
    });
  });

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const loopback = new Set([`127.0.0.1:${port}`, `localhost:${port}`]);
    if (!loopback.has(req.headers.host ?? "")) return refuse(res, 403, -32000, `host ${JSON.stringify(req.headers.host ?? "")} refused: this server answers on 127.0.0.1:${port} only`);
    const origin = req.headers.origin;
    if (origin !== undefined && !loopback.has(origin.replace(/^https?:\/\//, ""))) return refuse(res, 403, -32000, `origin ${JSON.stringify(origin)} refused`);
    if ((req.url ?? "").split("?")[0] !== MCP_PATH) return refuse(res, 404, -32000, `no such path: the MCP endpoint is ${MCP_PATH}`);
    if (req.method !== "POST") {
      res.setHeader("Allow", "POST");
      return refuse(res, 405, -32000, `${req.method ?? ""} not allowed: this server is stateless, every message is a POST`);
    }
    const auth = /^Bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? "");
    const userId = auth === null ? undefined : o.keys.userFor(auth[1]!);
    if (userId === undefined) {
      res.setHeader("WWW-Authenticate", 'Bearer realm="dki-mcp"');
      return refuse(res, 401, -32001, auth === null ? "missing Authorization: Bearer <key>" : "unknown key");
    }
    const body = await readBody(req);
    if (body === null) return refuse(res, 413, -32600, `request body over ${MAX_BODY_BYTES} bytes`);
    let message: unknown;
    try {
      message = JSON.parse(body);
    } catch (e) {
      return refuse(res, 400, -32700, `parse error: ${(e as Error).message}`);
    }
    const server = createMemoryServer({ ...o, userId });
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    res.on("close", () => {
      void transport.close();
      void server.close();
    });
    await server.connect(transport);
    await transport.handleRequest(req, res, message);
  }

  await new Promise<void>((resolve, reject) => {
    http.once("error", reject);
    http.listen(o.port, "127.0.0.1", () => {
      http.off("error", reject);
      resolve();
    });
  });
  port = (http.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}${MCP_PATH}`,
    port,
    close: () =>
      new Promise<void>((resolve, reject) => {
        http.close((e) => (e ? reject(e) : resolve()));
        http.closeAllConnections();
      }),
  };
}

/** A JSON-RPC error answer with an HTTP status (what an MCP client reads from a refused request). */
function refuse(res: ServerResponse, status: number, code: number, message: string): void {
  res.writeHead(status, { "Content-Type": "application/json" }).end(JSON.stringify({ jsonrpc: "2.0", error: { code, message }, id: null }));
}

/** The body as text, or null when it is over MAX_BODY_BYTES (the rest is not read). */
async function readBody(req: IncomingMessage): Promise<string | null> {
  const chunks: Buffer[] = [];
  let n = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    n += chunk.length;
    if (n > MAX_BODY_BYTES) return null;
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString("utf8");
}
